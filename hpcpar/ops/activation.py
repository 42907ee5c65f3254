"""GELU, tanh form (GPT-2's):

    y  = 0.5 x (1 + t),         t = tanh(u),   u = sqrt(2/pi) (x + 0.044715 x^3)
    dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)

The forward returns t as its cache, so the backward does not evaluate tanh again (the most expensive
elementwise op here).  Both are written as chains of in-place operations: on a (B*T, 4C) activation
every temporary array costs as much time as a flop-light op.
"""
import math

from hpcpar.backend import array_module

_S = math.sqrt(2.0 / math.pi)
_K = 0.044715


def gelu_forward(x):
    """x -> (y, t)"""
    xp = array_module(x)
    t = x * x                   # u = S x (1 + K x^2)
    t *= _K
    t += 1.0
    t *= x
    t *= _S
    xp.tanh(t, out=t)
    y = t + 1.0
    y *= x
    y *= 0.5
    return y, t


def gelu_backward(dy, x, t):
    d = x * x                   # S (1 + 3K x^2)
    d *= 3.0 * _K
    d += 1.0
    d *= _S
    s = t * t                   # x (1 - t^2) S (1 + 3K x^2)
    s -= 1.0
    s *= -x
    s *= d
    s += t                      # 1 + t + ...
    s += 1.0
    s *= dy
    s *= 0.5
    return s
