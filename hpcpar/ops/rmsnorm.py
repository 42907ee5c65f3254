"""RMS normalisation over the last axis (Llama's, Zhang & Sennrich 2019): LayerNorm without the mean
and without the bias.

    rstd = 1 / sqrt(mean(x^2) + eps),   xhat = x rstd,   y = xhat g

Backward, with dxhat = dy g (each row independently; C the normalised size).  d rstd / d x_j =
-rstd^3 x_j / C, so the rows of the Jacobian differ from rstd I by one rank-one term:

    dx = rstd (dxhat - xhat mean(dxhat xhat))
    dg = sum over rows of dy xhat

The cache keeps xhat and rstd, as LayerNorm's does (ops/layernorm.py).
"""
from hpcpar.backend import array_module


def rmsnorm_forward(x, g, eps=1e-6):
    """x (..., C), g (C,) -> y (..., C), cache (xhat (..., C), rstd (..., 1))"""
    xp = array_module(x)
    C = x.shape[-1]
    rstd = xp.einsum("...i,...i->...", x, x)[..., None]       # (..., 1) sum of squares
    rstd *= 1.0 / C
    rstd += eps
    rstd = 1.0 / xp.sqrt(rstd)
    xhat = x * rstd                                           # (..., C)
    return xhat * g, (xhat, rstd)


def rmsnorm_backward_input(dy, g, cache):
    xp = array_module(dy)
    xhat, rstd = cache
    dxhat = dy * g                                            # (..., C)
    proj = xp.einsum("...i,...i->...", dxhat, xhat)[..., None] / dy.shape[-1]    # mean(dxhat xhat)
    dxhat -= xhat * proj
    dxhat *= rstd
    return dxhat


def rmsnorm_backward_weight(dy, cache):
    xhat, _ = cache
    C = dy.shape[-1]
    return array_module(dy).einsum("ni,ni->i", dy.reshape(-1, C), xhat.reshape(-1, C))     # (C,)
