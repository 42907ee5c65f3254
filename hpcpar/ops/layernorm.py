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
    mean = x.mean(axis=-1, keepdims=True)                   # (..., 1)
    xc = x - mean                                           # (..., C)
    rstd = 1.0 / xp.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)   # (..., 1)
    xhat = xc * rstd                                        # (..., C)
    return xhat * g + b, (xhat, rstd)


def layernorm_backward_input(dy, g, cache):
    xhat, rstd = cache
    dxhat = dy * g                                          # (..., C)
    return rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                   - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))


def layernorm_backward_weight(dy, cache):
    xhat, _ = cache
    C = dy.shape[-1]
    return (dy * xhat).reshape(-1, C).sum(axis=0), dy.reshape(-1, C).sum(axis=0)   # (C,), (C,)
