"""All-to-all exercises: the Ulysses transpose, the sequence cut of a cp group turned into a head cut
(hpcpar/context_parallel/transpose.py, docs/context_parallel.md)."""
import numpy as np

from hpcpar.context_parallel.transpose import simulate_seq_to_heads
from hpcpar.course.wrong import Wrong
from hpcpar.ops.ring_attention import balanced_positions


def seq_to_heads(parts, positions):
    """Reference: parts[r] (B, H, T/p, HS) of rank r's tokens at ``positions[r]`` -> list over ranks j of
    (B, H/p, T, HS): heads j H/p .. (j+1) H/p - 1 of every token, in sequence order."""
    return simulate_seq_to_heads(parts, [np.asarray(p) for p in positions])


def check_seq_to_heads(f):
    rng = np.random.default_rng(26)
    cases = [("2 ranks, contiguous halves of the sequence", 2, lambda T, p: [np.arange(r * T // p, (r + 1) * T // p)
                                                                          for r in range(p)]),
             ("2 ranks, the causal balance (chunks r and 2p-1-r)", 2, lambda T, p: [balanced_positions(T, p, r)
                                                                                  for r in range(p)]),
             ("4 ranks, the causal balance", 4, lambda T, p: [balanced_positions(T, p, r) for r in range(p)])]
    for what, p, cut in cases:
        T, H = 16, 8
        positions = cut(T, p)
        whole = rng.standard_normal((2, H, T, 3))
        parts = [whole[:, :, pos].copy() for pos in positions]
        got = f([x.copy() for x in parts], [pos.copy() for pos in positions])
        want = seq_to_heads(parts, positions)
        if len(got) != p:
            raise Wrong(f"{what}: {len(got)} arrays, expected one per rank ({p})")
        for j, (g, w) in enumerate(zip(got, want)):
            g = np.asarray(g)
            if g.shape != w.shape:
                raise Wrong(f"{what}: rank {j} gets shape {g.shape}, expected {w.shape} (B, H/p, T, HS)")
            bad = g != w
            if bad.any():
                b, h, t, _ = (int(i) for i in np.argwhere(bad)[0])
                raise Wrong(f"{what}: rank {j}, its head {h}, token {t} of the sequence is wrong")
