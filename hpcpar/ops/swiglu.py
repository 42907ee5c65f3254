"""SwiGLU, the gated feed-forward activation of Llama (Shazeer 2020): two projections of the same
input, one passed through SiLU, multiplied elementwise.

    h = silu(a) u,        silu(a) = a s,   s = sigmoid(a)       a = x W_gate, u = x W_up, both (..., F)

Backward, with silu'(a) = s + a s (1 - s) = s (1 + a (1 - s)):

    du = dh silu(a),      da = dh u s (1 + a (1 - s))

The sigmoid is written 0.5 (1 + tanh(a / 2)): the same function, with no exp(-a) to overflow for
very negative a.  The cache keeps s and silu(a).
"""
from hpcpar.backend import array_module


def swiglu_forward(a, u):
    """a, u (..., F) -> h (..., F), cache (s, silu(a))"""
    xp = array_module(a)
    s = xp.tanh(a * 0.5)
    s += 1.0
    s *= 0.5                                  # sigmoid(a)
    silu = a * s
    return silu * u, (s, silu)


def swiglu_backward(dh, a, u, cache):
    """dh (..., F) -> da, du (..., F)"""
    s, silu = cache
    du = dh * silu
    da = 1.0 - s                              # s (1 + a (1 - s)) dh u
    da *= a
    da += 1.0
    da *= s
    da *= dh
    da *= u
    return da, du
