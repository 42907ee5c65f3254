"""Softmax along the last axis, numerically stable (shift by the row maximum first).

    y_i = exp(x_i - max x) / sum_j exp(x_j - max x)
    dx_i = y_i (dy_i - sum_j dy_j y_j)          (the Jacobian diag(y) - y y^T applied to dy)
"""
from hpcpar.backend import array_module


def softmax_forward(x):
    e = x - x.max(axis=-1, keepdims=True)
    array_module(e).exp(e, out=e)              # in place: saves one (B, NH, T, T) temporary
    e /= e.sum(axis=-1, keepdims=True)
    return e


def softmax_backward(dy, y):
    """Overwrites dy (callers pass a temporary)."""
    dot = (dy * y).sum(axis=-1, keepdims=True)
    dy -= dot
    dy *= y
    return dy

