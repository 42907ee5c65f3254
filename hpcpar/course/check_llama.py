"""Llama exercises: the backward of the rotary embedding, and which key/value head each query head of a
rank uses when tensor parallelism cuts grouped-query attention (hpcpar/ops/rope.py, ops/gqa.py)."""
import numpy as np

from hpcpar.course.wrong import Wrong
from hpcpar.nn.parameter import Shard
from hpcpar.ops.gqa import repeat_kv_forward
from hpcpar.ops.rope import rope_backward, rope_forward, rope_tables


def check_rope_backward(f):
    rng = np.random.default_rng(5)
    for T, HS, positions in ((4, 8, np.arange(4)), (6, 4, np.array([3, 4, 5, 12, 13, 14])), (3, 16, np.arange(3))):
        cos, sin = rope_tables(positions, HS, 10000.0, np.float64, np)
        dy = rng.standard_normal((2, 3, T, HS))
        got, want = np.asarray(f(dy.copy(), cos, sin)), rope_backward(dy, cos, sin)
        if got.shape != want.shape:
            raise Wrong(f"T {T}, HS {HS}: dx has shape {got.shape}, expected {want.shape}")
        if not np.allclose(got, want, rtol=1e-12, atol=1e-12):
            b, h, t, i = (int(j) for j in np.argwhere(~np.isclose(got, want, rtol=1e-12, atol=1e-12))[0])
            half = "first" if i < HS // 2 else "second"
            raise Wrong(f"T {T}, HS {HS}: dx[{b}, {h}, {t}, {i}] (the {half} half of the features) is "
                        f"{got[b, h, t, i]:.6g}, expected {want[b, h, t, i]:.6g}")
        x = rng.standard_normal(dy.shape)                     # <dy, J x> = <J^T dy, x>: the adjoint's test
        if not np.isclose(np.vdot(dy, rope_forward(x, cos, sin)), np.vdot(got, x), rtol=1e-10):
            raise Wrong("dx is not the transpose of the rotation applied to dy")


def kv_heads(n_head, n_kv_head, tp, rank):
    """Reference: for each query head rank ``rank`` holds (in its order), the global index of the key/value
    head it attends with.  TP gives each rank n_head/tp consecutive query heads and n_kv_head/tp
    consecutive K/V heads (Shard along the head axis), and the rank repeats its K/V heads locally."""
    q_local = Shard(0, tp, rank).take(np.arange(n_head))
    kv_local = Shard(0, tp, rank).take(np.arange(n_kv_head))
    rep = len(q_local) // len(kv_local)
    return [int(h) for h in repeat_kv_forward(kv_local.reshape(1, -1, 1, 1), rep).ravel()]


def check_kv_heads(f):
    for n_head, n_kv_head, tp in ((8, 2, 2), (8, 4, 2), (8, 8, 4), (12, 4, 4), (8, 1, 1), (16, 4, 2)):
        for rank in range(tp):
            got, want = [int(h) for h in f(n_head, n_kv_head, tp, rank)], kv_heads(n_head, n_kv_head, tp, rank)
            if len(got) != len(want):
                raise Wrong(f"{n_head} query heads, {n_kv_head} K/V heads, tp {tp}, rank {rank}: {len(got)} "
                            f"entries; the rank holds {len(want)} query heads")
            if got != want:
                i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
                raise Wrong(f"{n_head} query heads, {n_kv_head} K/V heads, tp {tp}, rank {rank}: the rank's "
                            f"query head {i} (global {rank * len(want) + i}) uses K/V head {want[i]}, not {got[i]}")
