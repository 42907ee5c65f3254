"""Layer normalisation over the last axis.

    mean = sum(x)/C,  rstd = 1/sqrt(var(x) + eps),  xhat = (x - mean) rstd,  y = xhat g + b

Backward, with dxhat = dy g (each row independently; C the normalised size):

    dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
    dg = sum over rows of dy xhat,    db = sum over rows of dy

The cache keeps xhat and rstd, not x: that is all the backward needs.  ``layernorm_forward_plain`` and
``layernorm_backward_plain`` are these lines as written, on whole arrays: read them first.  The
engine's pair below computes the same numbers tuned for the cache (tests/test_fast_ops.py holds
them equal, float64 to 1e-12).  Rows are independent, so the
forward and the backward run one cache-sized block of rows at a time (ops/blocks.py).  Row means are
matrix-vector products with a vector of 1/C (BLAS gemv: several times faster than numpy's reduction
over rows this short).  The backward gives dx, dg and db in one pass (as llm.c's layernorm_backward):
w = dy xhat, one block at a time in a scratch block, serves three sums as matrix-vector products - dg
(its column sums), db (dy's) and mean(dxhat xhat) = w g / C (its rows against g) - while the block is
in cache, instead of a second pass that read dy and xhat from memory again and einsums per row.
"""
from hpcpar.backend import array_module
from hpcpar.ops.blocks import row_blocks


def layernorm_forward_plain(x, g, b, eps=1e-5):
    """x (..., C), g, b (C,) -> y (..., C), cache (xhat (..., C), rstd (..., 1))"""
    xp = array_module(x)
    mean = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / xp.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    return xhat * g + b, (xhat, rstd)


def layernorm_backward_plain(dy, g, cache):
    """-> dx (..., C), dg (C,), db (C,)"""
    xhat, rstd = cache
    C = dy.shape[-1]
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).reshape(-1, C).sum(axis=0), dy.reshape(-1, C).sum(axis=0)


def layernorm_forward(x, g, b, eps=1e-5):
    xp = array_module(x)
    C = x.shape[-1]
    xhat, y = xp.empty(x.shape, x.dtype), xp.empty(x.shape, x.dtype)     # (..., C)
    rstd = xp.empty(x.shape[:-1] + (1,), x.dtype)                          # (..., 1)
    avg = xp.full((C, 1), 1.0 / C, dtype=x.dtype)                           # row @ avg = row mean
    for xb, hb, rb, yb in row_blocks(x, xhat, rstd, y):
        xp.subtract(xb, xb @ avg, out=hb)                                  # centred
        var = xp.einsum("ij,ij->i", hb, hb)[:, None]                     # no (rows, C) temporary
        var *= 1.0 / C
        var += eps
        xp.sqrt(var, out=rb)
        xp.divide(1.0, rb, out=rb)                                         # rstd
        hb *= rb                                                           # normalised
        xp.multiply(hb, g, out=yb)
        yb += b
    return y, (xhat, rstd)


def layernorm_backward(dy, g, cache):
    """-> dx (..., C), dg (C,), db (C,)"""
    xp = array_module(dy)
    xhat, rstd = cache
    C = dy.shape[-1]
    dx = xp.empty(dy.shape, dy.dtype)
    dg, db = xp.zeros(C, dy.dtype), xp.zeros(C, dy.dtype)
    avg = xp.full((C, 1), 1.0 / C, dtype=dy.dtype)
    g_avg = g[:, None] / C                                                 # w @ g_avg = mean(dxhat xhat)
    scratch = None
    for dyb, hb, rb, dxb in row_blocks(dy, xhat, rstd, dx):
        if scratch is None:
            scratch = xp.empty(dyb.shape, dy.dtype)
            ones = xp.ones(len(dyb), dtype=dy.dtype)                       # ones @ block = column sums
        w = xp.multiply(dyb, hb, out=scratch[:len(dyb)])                   # dy xhat
        dg += ones[:len(dyb)] @ w
        db += ones[:len(dyb)] @ dyb
        proj = w @ g_avg                                                   # mean(dxhat xhat), dxhat = dy g
        xp.multiply(dyb, g, out=dxb)                                       # dxhat
        dxb -= dxb @ avg
        xp.multiply(hb, proj, out=w)
        dxb -= w
        dxb *= rb
    return dx, dg, db
