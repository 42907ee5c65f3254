"""GELU, tanh form (GPT-2's):

    y  = 0.5 x (1 + t),         t = tanh(u),   u = sqrt(2/pi) (x + 0.044715 x^3)
    dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)

The forward returns t as its cache, so the backward does not evaluate tanh again (the most expensive
elementwise op here).  Both are chains of in-place operations, run one cache-sized block of rows at
a time (ops/blocks.py): on a (B*T, 4C) activation each extra pass over memory costs as much as a
flop-light op, and blocking turns ten passes over memory into about one (about 2x faster, measured).

``gelu_forward_fast`` / ``gelu_backward_fast`` are the same function with two passes fewer in the
backward (nine instead of eleven, measured in docs/performance.md).  Their cache is c = 1 + t, which
the forward computes on the way to y anyway, instead of t; with 1 - t^2 = (1 - t)(1 + t) = (2 - c) c:

    dy/dx = 0.5 c (1 + x (2 - c) S (1 + 3K x^2)) = c (0.5 + x (2 - c) (0.5 S + 1.5 SK x^2))

one product of factors, so no pass adds 1 to t, subtracts from it or halves the result.  They agree
with the plain pair to rounding (tests/test_fast_ops.py, float64 to 1e-12).
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


def gelu_forward_fast(x):
    """x -> (y, c), c = 1 + t"""
    xp = array_module(x)
    y, c = xp.empty(x.shape, x.dtype), xp.empty(x.shape, x.dtype)
    for xb, yb, cb in row_blocks(x, y, c):
        xp.multiply(xb, xb, out=cb)         # u = x (S + S K x^2)
        cb *= _S * _K
        cb += _S
        cb *= xb
        xp.tanh(cb, out=cb)                 # t
        cb += 1.0                           # c = 1 + t
        xp.multiply(xb, cb, out=yb)         # y = 0.5 x c
        yb *= 0.5
    return y, c


def gelu_backward_fast(dy, x, c):
    xp = array_module(x)
    dx = xp.empty(x.shape, x.dtype)
    for dyb, xb, cb, s in row_blocks(dy, x, c, dx):
        d = xb * xb                         # x (0.5 S + 1.5 SK x^2), one block's temporary
        d *= 1.5 * _S * _K
        d += 0.5 * _S
        d *= xb
        xp.subtract(2.0, cb, out=s)         # c (0.5 + (2 - c) x (0.5 S + 1.5 SK x^2)) dy
        s *= d
        s += 0.5
        s *= cb
        s *= dyb
    return dx
