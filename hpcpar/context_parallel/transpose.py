"""Ulysses' transposes (Jacobs et al. 2023, DeepSpeed-Ulysses): the sequence cut traded for a head cut
around attention, and back.  Pure functions: the all-to-all itself is a callable passed in (the cp
group's ``Communicator.all_to_all`` in ulysses.py, or ``exchange`` below for a list of simulated ranks).

Legend: cp ranks; B sequences; H heads of one array held before the transpose (this tp rank's);
T the whole sequence, Tl = T / cp the tokens a rank holds, at the global positions ``positions[r]``
(any cut: training/batches.py's causal balance, or contiguous runs); HS the head size; h = H / cp.

    seq_to_heads_forward    rank r holds x_r (B, H, Tl, HS) - its tokens, every head
                            rank j gets  y_j (B, h, T, HS)  - every token in sequence order, heads j h .. (j+1) h - 1
                            y_j[:, :, positions[i]] = x_i[:, j h : (j+1) h]            for every rank i
    seq_to_heads_backward   the adjoint: dx_i[:, j h : (j+1) h] = dy_j[:, :, positions[i]]

The transpose only moves numbers (a permutation of the group's elements), so its adjoint is its
inverse: the backward is the head cut turned back into the sequence cut, and it is also what turns
attention's output back in the forward.  One all-to-all moves several arrays at once (Q, K and V, or
dQ, dK and dV; grouped K/V has fewer heads than Q): each array is cut by heads on its own, and the
rank-j blocks of all of them travel as one block.

    message: (cp, B, sum of the arrays' h, Tl, HS), block j for rank j (contiguous, as MPI takes it)
    bytes a rank hands the all-to-all: B Tl HS (sum of the arrays' H) elements - the same both ways
"""
import numpy as np

from hpcpar.backend import array_module


def pack_heads(xs, cp):
    """[x (B, H_a, Tl, HS)] -> message (cp, B, sum H_a / cp, Tl, HS): block j holds rank j's heads of each x."""
    xp = array_module(xs[0])
    B, _, Tl, HS = xs[0].shape
    out = xp.empty((cp, B, sum(x.shape[1] for x in xs) // cp, Tl, HS), dtype=xs[0].dtype)
    at = 0
    for x in xs:
        h = x.shape[1] // cp
        out[:, :, at:at + h] = x.reshape(B, cp, h, Tl, HS).transpose(1, 0, 2, 3, 4)
        at += h
    return out


def unpack_sequence(message, positions, heads):
    """message (cp, B, sum h_a, Tl, HS), block i from rank i -> [y (B, h_a, T, HS)] with rank i's tokens
    at their positions.  ``heads``: the h_a of each array."""
    xp = array_module(message)
    cp, B, _, Tl, HS = message.shape
    order = np.concatenate(positions)                    # where each received token goes in the sequence
    whole = xp.empty((B, message.shape[2], cp * Tl, HS), dtype=message.dtype)
    whole[:, :, order] = message.transpose(1, 2, 0, 3, 4).reshape(B, message.shape[2], cp * Tl, HS)
    bounds = np.cumsum([0, *heads])
    return [whole[:, a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def pack_sequence(ys, positions):
    """[y (B, h_a, T, HS)] -> message (cp, B, sum h_a, Tl, HS): block i holds rank i's tokens of each y."""
    cp = len(positions)
    y = ys[0] if len(ys) == 1 else array_module(ys[0]).concatenate(ys, axis=1)       # (B, sum h_a, T, HS)
    B, h, _, HS = y.shape
    part = y[:, :, np.concatenate(positions)].reshape(B, h, cp, -1, HS)              # (B, h, cp, Tl, HS)
    return array_module(y).ascontiguousarray(part.transpose(2, 0, 1, 3, 4))


def unpack_heads(message, heads):
    """message (cp, B, sum h_a, Tl, HS), block j from rank j -> [x (B, cp h_a, Tl, HS)]: rank j's heads j h_a ..."""
    cp, B, _, Tl, HS = message.shape
    bounds = np.cumsum([0, *heads])
    return [array_module(message).ascontiguousarray(
        message[:, :, a:b].transpose(1, 0, 2, 3, 4).reshape(B, cp * (b - a), Tl, HS))
        for a, b in zip(bounds[:-1], bounds[1:])]


def seq_to_heads_forward(xs, positions, all_to_all):
    """[x (B, H_a, Tl, HS)] of this rank's tokens -> [y (B, H_a / cp, T, HS)] of this rank's heads."""
    cp = len(positions)
    return unpack_sequence(all_to_all(pack_heads(xs, cp)), positions, [x.shape[1] // cp for x in xs])


def seq_to_heads_backward(dys, positions, all_to_all):
    """[dy (B, h_a, T, HS)] of this rank's heads -> [dx (B, cp h_a, Tl, HS)] of this rank's tokens."""
    return unpack_heads(all_to_all(pack_sequence(dys, positions)), [dy.shape[1] for dy in dys])


def exchange(messages):
    """The all-to-all over a list of simulated ranks: block j of rank i's message becomes block i of rank j's."""
    return [np.stack([m[j] for m in messages]) for j in range(len(messages))]


def simulate_seq_to_heads(parts, positions):
    """The forward transpose of a whole group in one process: parts[r] (B, H, Tl, HS) -> list of (B, H/cp, T, HS)."""
    cp = len(parts)
    received = exchange([pack_heads([x], cp) for x in parts])
    return [unpack_sequence(m, positions, [parts[0].shape[1] // cp])[0] for m in received]


def simulate_heads_to_seq(parts, positions):
    """Its adjoint (and inverse): parts[j] (B, h, T, HS) -> list of (B, cp h, Tl, HS)."""
    received = exchange([pack_sequence([y], positions) for y in parts])
    return [unpack_heads(m, [parts[0].shape[1]])[0] for m in received]
