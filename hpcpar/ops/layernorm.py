"""Layer normalisation over the last axis.

    mean = sum(x)/C,  rstd = 1/sqrt(var(x) + eps),  xhat = (x - mean) rstd,  y = xhat g + b

Backward, with dxhat = dy g (each row independently; C the normalised size):

    dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
    dg = sum over rows of dy xhat,    db = sum over rows of dy

The cache keeps xhat and rstd, not x: that is all the backward needs.  Rows are independent, so the
forward and the input gradient run one cache-sized block of rows at a time (ops/blocks.py).  Row
means are matrix-vector products with a vector of 1/C (BLAS gemv: several times faster than numpy's
reduction over rows this short), row sums of products are einsums (no temporary array).
"""
from hpcpar.backend import array_module
from hpcpar.ops.blocks import row_blocks


def layernorm_forward(x, g, b, eps=1e-5):
    xp = array_module(x)
    C = x.shape[-1]
    xhat, y = xp.empty(x.shape, x.dtype), xp.empty(x.shape, x.dtype)     # (..., C)
    rstd = xp.empty(x.shape[:-1] + (1,), x.dtype)                          # (..., 1)
    avg = xp.full((C, 1), 1.0 / C, dtype=x.dtype)                           # row @ avg = row mean
    for xb, hb, rb, yb in row_blocks(x, xhat, rstd, y):
        xp.subtract(xb, xb @ avg, out=hb)                                  # centred
        var = xp.einsum("ij,ij->i", hb, hb)[:, None]
        var *= 1.0 / C
        var += eps
        xp.sqrt(var, out=rb)
        xp.divide(1.0, rb, out=rb)                                         # rstd
        hb *= rb                                                           # normalised
        xp.multiply(hb, g, out=yb)
        yb += b
    return y, (xhat, rstd)


def layernorm_backward_input(dy, g, cache):
    xp = array_module(dy)
    xhat, rstd = cache
    C = dy.shape[-1]
    dx = xp.empty(dy.shape, dy.dtype)
    avg = xp.full((C, 1), 1.0 / C, dtype=dy.dtype)
    for dyb, hb, rb, dxb in row_blocks(dy, xhat, rstd, dx):
        xp.multiply(dyb, g, out=dxb)                                       # dxhat
        proj = xp.einsum("ij,ij->i", dxb, hb)[:, None] / C                 # mean(dxhat xhat)
        dxb -= dxb @ avg
        dxb -= hb * proj
        dxb *= rb
    return dx


def layernorm_backward_weight(dy, cache):
    xp = array_module(dy)
    xhat, _ = cache
    C = dy.shape[-1]
    dy2 = dy.reshape(-1, C)                                                # (N, C)
    ones = xp.ones(dy2.shape[0], dtype=dy.dtype)                           # ones @ dy2 = column sums
    return xp.einsum("ni,ni->i", dy2, xhat.reshape(-1, C)), ones @ dy2     # (C,), (C,)
