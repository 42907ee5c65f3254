"""SwiGLU, the gated feed-forward activation of Llama (Shazeer 2020): two projections of the same
input, one passed through SiLU, multiplied elementwise.

    h = silu(a) u,        silu(a) = a s,   s = sigmoid(a)       a = x W_gate, u = x W_up, both (..., F)

Backward, with silu'(a) = s + a s (1 - s) = s + silu(a) (1 - s):

    du = dh silu(a),      da = dh u (s + silu(a) (1 - s))

The sigmoid is written 0.5 (1 + tanh(a / 2)): the same function, with no exp(-a) to overflow for
very negative a.  The cache keeps s and silu(a).
"""
from hpcpar.backend import array_module


def swiglu_forward(a, u):
    """a, u (..., F) -> h (..., F), cache (s, silu(a))"""
    xp = array_module(a)
    s = xp.multiply(a, 0.5)
    xp.tanh(s, out=s)
    s += 1.0
    s *= 0.5                                  # sigmoid(a)
    silu = a * s
    return silu * u, (s, silu)


def swiglu_backward(dh, a, u, cache, out=None):
    """dh (..., F) -> da, du (..., F); ``out``: (da, du) arrays to write them into (a gated MoE writes
    both halves of one (..., 2F) gradient at once)."""
    xp = array_module(dh)
    s, silu = cache
    da, du = out if out is not None else (xp.empty_like(s), xp.empty_like(s))
    xp.multiply(dh, silu, out=du)
    xp.subtract(1.0, s, out=da)               # (s + silu(a) (1 - s)) dh u
    da *= silu
    da += s
    da *= dh
    da *= u
    return da, du
