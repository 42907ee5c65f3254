"""GELU, tanh form (GPT-2's):

    y  = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3)
    dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2)

The backward recomputes tanh(u) from x instead of storing it: one array less per layer in the cache.
"""
import math

from hpcpar.backend import array_module

_S = math.sqrt(2.0 / math.pi)
_K = 0.044715


def gelu_forward(x):
    return 0.5 * x * (1.0 + _tanh(x))


def gelu_backward(dy, x):
    t = _tanh(x)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _S * (1.0 + 3.0 * _K * x * x))


def _tanh(x):
    return array_module(x).tanh(_S * (x + _K * x * x * x))
