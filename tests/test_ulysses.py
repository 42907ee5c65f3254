"""Ulysses' transposes as pure functions (hpcpar/context_parallel/transpose.py), on simulated ranks:
the sequence cut becomes the head cut of the whole sequence, the backward is its adjoint and inverse,
and several arrays with different head counts travel in one message."""
import numpy as np
import pytest

from hpcpar.context_parallel.transpose import (exchange, pack_heads, seq_to_heads_backward, seq_to_heads_forward,
                                               simulate_heads_to_seq, simulate_seq_to_heads, unpack_sequence)
from hpcpar.ops.ring_attention import balanced_positions

B, T, HS = 2, 16, 3


def cuts(cp):
    """train.py's causal balance, and contiguous runs: the transpose takes any cut."""
    return {"balanced": [balanced_positions(T, cp, r) for r in range(cp)],
            "contiguous": [np.arange(r * T // cp, (r + 1) * T // cp) for r in range(cp)]}


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("cut", ["balanced", "contiguous"])
def test_sequence_cut_becomes_head_cut_and_back(cp, cut):
    pos = cuts(cp)[cut]
    whole = np.random.default_rng(cp).standard_normal((B, 8, T, HS))
    parts = [whole[:, :, p] for p in pos]                      # rank r: its tokens, every head
    heads = simulate_seq_to_heads(parts, pos)
    h = 8 // cp
    for j in range(cp):                                        # rank j: its heads, every token in order
        np.testing.assert_array_equal(heads[j], whole[:, j * h:(j + 1) * h])
    for r, back in enumerate(simulate_heads_to_seq(heads, pos)):
        np.testing.assert_array_equal(back, parts[r])


def test_backward_is_the_adjoint():
    """<A x, y> = <x, A^T y> over the whole group: the backward is the forward's transpose."""
    cp, pos, rng = 2, cuts(2)["balanced"], np.random.default_rng(0)
    x = [rng.standard_normal((B, 4, T // cp, HS)) for _ in range(cp)]
    y = [rng.standard_normal((B, 2, T, HS)) for _ in range(cp)]
    lhs = sum((a * b).sum() for a, b in zip(simulate_seq_to_heads(x, pos), y))
    rhs = sum((a * b).sum() for a, b in zip(x, simulate_heads_to_seq(y, pos)))
    assert abs(lhs - rhs) <= 1e-12 * abs(rhs)


def test_q_and_grouped_kv_travel_in_one_message():
    """Q with 4 heads, K and V with 2 (grouped): one message per rank; each array cut by heads on its own."""
    cp, pos, rng = 2, cuts(2)["balanced"], np.random.default_rng(1)
    q, k, v = (rng.standard_normal((B, n, T, HS)) for n in (4, 2, 2))
    mine = [[a[:, :, p] for a in (q, k, v)] for p in pos]
    sent = [pack_heads(xs, cp) for xs in mine]
    assert sent[0].shape == (cp, B, 4, T // cp, HS)            # (4 + 2 + 2) / cp heads per block
    got = [unpack_sequence(m, pos, [2, 1, 1]) for m in exchange(sent)]
    for j in range(cp):
        for a, g in zip((q, k, v), got[j]):
            h = a.shape[1] // cp
            np.testing.assert_array_equal(g, a[:, j * h:(j + 1) * h])


def test_one_rank_functions_take_any_all_to_all():
    """seq_to_heads_forward/backward with the all-to-all of a group of one (the identity) are a no-op."""
    pos = [np.arange(T)]
    x = np.random.default_rng(2).standard_normal((B, 4, T, HS))
    (y,) = seq_to_heads_forward([x], pos, lambda m: m)
    (z,) = seq_to_heads_backward([y], pos, lambda m: m)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(z, x)
