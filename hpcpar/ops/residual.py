"""The residual connection y = x + f(x): in backward the gradient reaches x twice,

    dx = dy + df(x)^T dy

once straight through (the "gradient highway" that lets deep stacks train) and once through f.
Written out as its own op only to make that visible; the blocks use this function's rule with
``out`` = the branch's own fresh output, so that the sum needs no new (B, T, C) array.
"""
from hpcpar.backend import array_module


def residual_forward(x, fx, out=None):
    return array_module(fx).add(x, fx, out=out)


def residual_backward(dy, dx_through_f, out=None):
    return array_module(dy).add(dy, dx_through_f, out=out)
