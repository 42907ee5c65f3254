"""Softmax along the last axis, numerically stable (shift by the row maximum first).

    y_i = exp(x_i - max x) / sum_j exp(x_j - max x)
    dx_i = y_i (dy_i - sum_j dy_j y_j)          (the Jacobian diag(y) - y y^T applied to dy)

Rows are independent, so both run one cache-sized block of rows at a time (ops/blocks.py): the
five passes of the forward then read the (B, NH, T, T) scores from memory once.
"""
from hpcpar.backend import array_module
from hpcpar.ops.blocks import row_blocks


def softmax_forward(x, out=None):
    """``out=x`` computes in place (attention does: its scores are not needed afterwards)."""
    xp = array_module(x)
    y = xp.empty(x.shape, x.dtype) if out is None else out
    for xb, yb in row_blocks(x, y):
        xp.subtract(xb, xb.max(axis=-1, keepdims=True), out=yb)
        xp.exp(yb, out=yb)
        yb *= 1.0 / yb.sum(axis=-1, keepdims=True)   # a division per row, a multiplication per element
    return y


def softmax_backward(dy, y):
    """Overwrites dy (callers pass a temporary)."""
    xp = array_module(dy)
    for dyb, yb in row_blocks(dy, y):
        dyb -= xp.einsum("ij,ij->i", dyb, yb)[:, None]     # dy_i - sum_j dy_j y_j, no (rows, n) temporary
        dyb *= yb
    return dy
