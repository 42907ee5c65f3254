"""GELU, tanh form (GPT-2's):

    y  = 0.5 x (1 + t),         t = tanh(u),   u = sqrt(2/pi) (x + 0.044715 x^3)
    dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)

The forward returns t as its cache, so the backward does not evaluate tanh again (the most expensive
elementwise op here).  Both are chains of in-place operations, run one cache-sized block of rows at
a time (ops/blocks.py): on a (B*T, 4C) activation each extra pass over memory costs as much as a
flop-light op, and blocking turns ten passes over memory into about one (about 2x faster, measured).

``gelu_forward_fast`` / ``gelu_backward_fast`` are the same function, cheaper where it counts: the
forward caches the derivative itself instead of t, so the backward is one product and the input x
need not be kept.  With c = 1 + t and 1 - t^2 = (1 - t)(1 + t) = (2 - c) c:

    g = dy/dx = 0.5 c (1 + x (2 - c) S (1 + 3K x^2)) = c (0.5 + x (2 - c) (0.5 S + 1.5 SK x^2))
    backward  dx = dy g

The forward's chain is longer (15 passes over each block, in cache, against 8), the backward one pass
over memory instead of nine that also read x and t back: fewer trips to memory in all, and with
``out=x`` y is written over x, which the MLP no longer needs (measured in docs/performance.md).  They
agree with the plain pair to rounding (tests/test_fast_ops.py, float64 to 1e-12).
"""
import math

from hpcpar.backend import array_module
from hpcpar.ops.blocks import row_blocks

_S = math.sqrt(2.0 / math.pi)
_K = 0.044715


def gelu_forward(x):
    """x -> (y, t)"""
    xp = array_module(x)
    y, t = xp.empty(x.shape, x.dtype), xp.empty(x.shape, x.dtype)
    for xb, yb, tb in row_blocks(x, y, t):
        xp.multiply(xb, xb, out=tb)         # u = x (S + S K x^2)
        tb *= _S * _K
        tb += _S
        tb *= xb
        xp.tanh(tb, out=tb)                 # t
        xp.add(tb, 1.0, out=yb)             # y = 0.5 x (1 + t)
        yb *= xb
        yb *= 0.5
    return y, t


def gelu_backward(dy, x, t):
    xp = array_module(x)
    dx = xp.empty(x.shape, x.dtype)
    for dyb, xb, tb, s in row_blocks(dy, x, t, dx):
        d = xb * xb                         # S (1 + 3K x^2), one block's temporary
        d *= 3.0 * _S * _K
        d += _S
        xp.multiply(tb, tb, out=s)          # x (t^2 - 1) S (1 + 3K x^2)
        s -= 1.0
        s *= xb
        s *= d
        xp.subtract(tb, s, out=s)           # t + x (1 - t^2) S (1 + 3K x^2)
        s += 1.0                            # 1 + t + ...
        s *= dyb
        s *= 0.5
    return dx


def gelu_forward_fast(x, out=None):
    """x -> (y, g), g = dy/dx.  ``out=x`` writes y over x (its rows are read before they are written)."""
    xp = array_module(x)
    y, g = xp.empty(x.shape, x.dtype) if out is None else out, xp.empty(x.shape, x.dtype)
    scratch = None
    for xb, yb, gb in row_blocks(x, y, g):
        if scratch is None:                 # two blocks of temporaries, reused block after block
            scratch = xp.empty((2,) + xb.shape, x.dtype)
        c, d = scratch[0, :len(xb)], scratch[1, :len(xb)]
        xp.multiply(xb, xb, out=c)
        xp.multiply(c, 1.5 * _S * _K, out=d)    # d = x (0.5 S + 1.5 SK x^2)
        d += 0.5 * _S
        d *= xb
        c *= _S * _K                            # u = x (S + SK x^2)
        c += _S
        c *= xb
        xp.tanh(c, out=c)
        c += 1.0                                # c = 1 + t
        xp.subtract(2.0, c, out=gb)             # g = c (0.5 + (2 - c) d)
        gb *= d
        gb += 0.5
        gb *= c
        xp.multiply(xb, c, out=yb)              # y = 0.5 x c
        yb *= 0.5
    return y, g


def gelu_backward_fast(dy, g, out=None):
    """dx = dy g; ``out=dy`` in place (the MLP passes its own temporary)."""
    return array_module(dy).multiply(dy, g, out=out)
