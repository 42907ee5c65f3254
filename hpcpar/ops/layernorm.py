"""Layer normalisation over the last axis.

    mean = sum(x)/C,  rstd = 1/sqrt(var(x) + eps),  xhat = (x - mean) rstd,  y = xhat g + b

Backward, with dxhat = dy g (each row independently; C the normalised size):

    dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
    dg = sum over rows of dy xhat,    db = sum over rows of dy

The cache keeps xhat and rstd, not x: that is all the backward needs.
"""
from hpcpar.backend import array_module


def layernorm_forward(x, g, b, eps=1e-5):
    xp = array_module(x)
    xhat = x - x.mean(axis=-1, keepdims=True)               # (..., C) centred
    var = xp.einsum("...i,...i->...", xhat, xhat)[..., None] / x.shape[-1]   # (..., 1)
    rstd = 1.0 / xp.sqrt(var + eps)                         # (..., 1)
    xhat *= rstd                                            # (..., C) normalised
    y = xhat * g
    y += b
    return y, (xhat, rstd)


def layernorm_backward_input(dy, g, cache):
    xp = array_module(dy)
    xhat, rstd = cache
    C = dy.shape[-1]
    dxhat = dy * g                                          # (..., C)
    proj = xp.einsum("...i,...i->...", dxhat, xhat)[..., None] / C     # mean(dxhat xhat)
    dx = dxhat - dxhat.mean(axis=-1, keepdims=True)
    dx -= xhat * proj
    dx *= rstd
    return dx


def layernorm_backward_weight(dy, cache):
    xhat, _ = cache
    C = dy.shape[-1]
    return (dy * xhat).reshape(-1, C).sum(axis=0), dy.reshape(-1, C).sum(axis=0)   # (C,), (C,)
