"""Llama exercises: the backward of the rotary embedding, which key/value head each query head of a rank
uses when tensor parallelism cuts grouped-query attention, and the input gradient of QK-norm
(hpcpar/ops/rope.py, ops/gqa.py, ops/qk_norm.py)."""
import numpy as np

from hpcpar.course.wrong import Wrong
from hpcpar.nn.parameter import Shard
from hpcpar.ops.gqa import repeat_kv_forward
from hpcpar.ops.qk_norm import qk_norm_backward_input, qk_norm_forward
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


def qk_norm_dx(dy, x, g, eps=1e-6):
    """Reference: dL/dx of QK-norm for the queries or the keys, x (B, heads, T, HS), g (HS,): the engine's
    op (ops/qk_norm.py) with x as both (its keys' half is the same function of theirs)."""
    _, _, cache = qk_norm_forward(x, x, g, g, eps)
    return qk_norm_backward_input(dy, dy, g, g, cache)[0]


def _qk_norm(x, g, eps):
    return qk_norm_forward(x, x, g, g, eps)[0]


def check_qk_norm_dx(f):
    rng = np.random.default_rng(27)
    # (what, (B, heads, T, HS), scale of x): queries, GQA's fewer keys, a wider head, one head; x far
    # above sqrt(eps) and far below it, where eps, not x, sets rstd
    for what, shape, scale in (("queries", (2, 4, 3, 8), 1.0), ("keys", (2, 2, 3, 8), 1.0),
                               ("queries", (1, 3, 5, 16), 30.0), ("keys", (3, 1, 2, 4), 1e-4)):
        x, dy = scale * rng.standard_normal(shape), rng.standard_normal(shape)
        g = 1 + 0.5 * rng.standard_normal(shape[-1])
        got, want = np.asarray(f(dy.copy(), x.copy(), g.copy(), 1e-6)), qk_norm_dx(dy, x, g, 1e-6)
        case = f"{what} of shape (B, heads, T, HS) = {shape}" + (f", x ~ {scale:g}" if scale != 1 else "")
        if got.shape != want.shape:
            raise Wrong(f"{case}: dx has shape {got.shape}, expected {want.shape}")
        bad = ~np.isclose(got, want, rtol=1e-12, atol=1e-12)
        if bad.any():
            rstd = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
            if np.allclose(got, rstd * g * dy, rtol=1e-12, atol=1e-12):
                raise Wrong(f"{case}: dx is rstd g dy - rstd is held constant, but it depends on x too: "
                            "its derivative adds a term along xhat")
            at = tuple(int(j) for j in np.argwhere(bad)[0])
            digits = 6 if f"{got[at]:.6g}" != f"{want[at]:.6g}" else 15         # a small slip shows too
            raise Wrong(f"{case}: dx[{', '.join(map(str, at))}] is {got[at]:.{digits}g}, "
                        f"expected {want[at]:.{digits}g}")
    # a point none of the above saw: the directional derivative by central differences,
    # <dy, (y(x + e v) - y(x - e v)) / 2e> = <dx, v> up to O(e^2)
    x, dy, v = (rng.standard_normal((2, 3, 4, 6)) for _ in range(3))
    g, e = 1 + 0.5 * rng.standard_normal(6), 1e-5
    slope = np.vdot(dy, _qk_norm(x + e * v, g, 1e-6) - _qk_norm(x - e * v, g, 1e-6)) / (2 * e)
    got = np.vdot(np.asarray(f(dy.copy(), x.copy(), g.copy(), 1e-6)), v)
    if not np.isclose(got, slope, rtol=1e-7):
        raise Wrong(f"at a new point, (B, heads, T, HS) = (2, 3, 4, 6): <dx, v> = {got:.8g}, but the loss "
                    f"changes along v at {slope:.8g} (<dy, y(x + e v) - y(x - e v)> / 2e, central differences): "
                    "dx is not the gradient")
