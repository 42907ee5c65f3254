"""Attention exercise: the causal attention forward in blocks of query rows, each block meeting only the
keys at or before its last row (hpcpar/ops/attention.py, docs/engine.md)."""
import numpy as np

from hpcpar.course.wrong import Wrong
from hpcpar.ops.attention import attention_forward, query_blocks


def causal_blocks_forward(q, k, v, block):
    """Reference: q, k, v (B, NH, T, HS) -> o (B, NH, T, HS) and the blocks' probabilities
    [P (B, NH, z - a, z) for each block [a, z) of ``block`` query rows]: the engine's forward, and the
    P its backward keeps."""
    o, (_, _, _, ps, _, _) = attention_forward(q, k, v, block=block)
    return o, ps


def _first_difference(got, want):
    """(index, "is .., expected ..") of the first element of got that is not want to 1e-12, or None."""
    bad = ~np.isclose(got, want, rtol=1e-12, atol=1e-12)
    if not bad.any():
        return None
    i = tuple(int(j) for j in np.argwhere(bad)[0])
    return i, f"is {got[i]:.6g}, expected {want[i]:.6g} (off by {got[i] - want[i]:.2g})"


def check_causal_blocks_forward(f):
    rng = np.random.default_rng(29)
    # (B, NH, T, HS, block): whole blocks, a short last block, fewer rows than a block, blocks of one row
    for B, NH, T, HS, block in ((2, 3, 12, 4, 4), (1, 2, 10, 8, 4), (2, 2, 5, 4, 8), (1, 3, 6, 16, 1)):
        case = f"T {T} in blocks of {block} rows, (B, NH, T, HS) = {(B, NH, T, HS)}"
        q, k, v = (rng.standard_normal((B, NH, T, HS)) for _ in range(3))
        o, (_, _, _, (p,), _, _) = attention_forward(q, k, v, block=T)      # the plain attention: one block
        got_o, got_ps = f(q.copy(), k.copy(), v.copy(), block)
        blocks = query_blocks(T, block)
        if len(got_ps) != len(blocks):
            raise Wrong(f"{case}: {len(got_ps)} arrays of P, expected one per block of query rows ({len(blocks)})")
        for (a, z), got in zip(blocks, got_ps):
            got, want = np.asarray(got), p[:, :, a:z, :z]
            if got.shape != want.shape:
                keys = "" if got.shape[:-1] != want.shape[:-1] else \
                    " - it has keys after its last query, where P is 0" if got.shape[-1] > z else \
                    " - it has fewer keys than its last query sees"
                raise Wrong(f"{case}: block [{a}, {z})'s P has shape {got.shape}, expected {want.shape}{keys}")
            # a key after its query first: a missing mask also shifts the row's other probabilities
            later = np.arange(z) > np.arange(a, z)[:, None]         # (z - a, z): key j after query a + i
            wrong = _first_difference(np.where(later, got, want), want) or _first_difference(got, want)
            if wrong:
                (b, h, i, j), values = wrong
                seen = "a key after the query: P is 0 there" if j > a + i else "a key the query sees"
                raise Wrong(f"{case}: block [{a}, {z})'s P[{b}, {h}, query {a + i}, key {j}] ({seen}) {values}")
        got_o = np.asarray(got_o)
        if got_o.shape != o.shape:
            raise Wrong(f"{case}: o has shape {got_o.shape}, expected {o.shape}")
        wrong = _first_difference(got_o, o)
        if wrong:
            raise Wrong(f"{case}: o[{', '.join(map(str, wrong[0]))}] {wrong[1]}")
