"""SwiGLU, the gated feed-forward activation of Llama (Shazeer 2020): two projections of the same
input, one passed through SiLU, multiplied elementwise.

    h = silu(a) u,        silu(a) = a s,   s = sigmoid(a)       a = x W_gate, u = x W_up, both (..., F)

Backward, with silu'(a) = s + a s (1 - s) = s + silu(a) (1 - s):

    du = dh silu(a),      da = dh u (s + silu(a) (1 - s))

The sigmoid is written 0.5 (1 + tanh(a / 2)): the same function, with no exp(-a) to overflow for
very negative a.  ``swiglu_forward_plain`` and ``swiglu_backward_plain`` are these lines on whole
arrays: read them first; the engine's pair below computes the same numbers block by block
(tests/test_fast_ops.py holds them equal, float64 to 1e-12).  The cache keeps s only: the backward has a (the caller keeps it) and remakes
silu(a) = a s, one product, rather than read a cached copy back from memory.  Both directions are
chains of six or seven passes, run one cache-sized block of rows at a time (ops/blocks.py): a and u
are usually the two halves of one GEMM's output, megabytes that no L2 holds, and blocked the chain
reads them from memory about once.
"""
from hpcpar.backend import array_module
from hpcpar.ops.blocks import row_blocks


def swiglu_forward_plain(a, u):
    """a, u (..., F) -> h (..., F), cache s = sigmoid(a)"""
    s = 0.5 * (1.0 + array_module(a).tanh(0.5 * a))
    return a * s * u, s


def swiglu_backward_plain(dh, a, u, s):
    """dh (..., F) -> da, du (..., F)"""
    silu = a * s
    return dh * u * (s + silu * (1.0 - s)), dh * silu


def swiglu_forward(a, u):
    """a, u (..., F) -> h (..., F), cache s = sigmoid(a)"""
    xp = array_module(a)
    s, h = xp.empty(a.shape, a.dtype), xp.empty(a.shape, a.dtype)
    for ab, ub, sb, hb in row_blocks(a, u, s, h):
        xp.multiply(ab, 0.5, out=sb)
        xp.tanh(sb, out=sb)
        sb += 1.0
        sb *= 0.5                             # sigmoid(a)
        xp.multiply(ab, sb, out=hb)           # silu(a)
        hb *= ub
    return h, s


def swiglu_backward(dh, a, u, s, out=None):
    """dh (..., F) -> da, du (..., F); ``out``: (da, du) arrays to write them into (a gated MoE writes
    both halves of one (..., 2F) gradient at once: two-dimensional, so their rows are views)."""
    xp = array_module(dh)
    da, du = out if out is not None else (xp.empty_like(s), xp.empty_like(s))
    for dhb, ab, ub, sb, dab, dub in row_blocks(dh, a, u, s, da, du):
        silu = ab * sb                        # the block's temporaries are contiguous; a, u, da and du
        g = xp.subtract(1.0, sb)              # are often strided halves of a wider array, and numpy runs
        g *= silu                             # a pass over a strided block row by row (1.5-2x slower):
        g += sb                               # each of them is touched once
        g *= dhb                              # (s + silu(a) (1 - s)) dh
        xp.multiply(dhb, silu, out=dub)
        xp.multiply(g, ub, out=dab)
    return da, du
