"""Softmax along the last axis, numerically stable (shift by the row maximum first).

    y_i = exp(x_i - max x) / sum_j exp(x_j - max x)
    dx_i = y_i (dy_i - sum_j dy_j y_j)          (the Jacobian diag(y) - y y^T applied to dy)

Rows are independent, so both run one cache-sized block of rows at a time (ops/blocks.py): the
five passes of the forward then read the (B, NH, T, T) scores from memory once.

``softmax_forward_fast`` is the same function, faster on short rows (attention's rows are T = 128
long): numpy reduces a short row to its maximum one element at a time (the row maximum was more than
half of the softmax, measured), so it takes the maximum of the two halves of every row instead,
element-wise over the whole block (vectorised), then of the halves of that, ... - the same maximum,
exactly - and sums the rows as a matrix-vector product (BLAS).  It agrees with softmax_forward to
rounding (tests/test_ops.py, float64 to 1e-12).
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


def row_max(x):
    """(rows, n) -> (rows, 1), each row's maximum: halve the rows while their length is even."""
    xp = array_module(x)
    m = x
    while m.shape[-1] > 1 and m.shape[-1] % 2 == 0:
        half = m.shape[-1] // 2
        m = xp.maximum(m[:, :half], m[:, half:])            # (rows, n / 2^k), a block-sized temporary
    return m if m.shape[-1] == 1 else m.max(axis=-1, keepdims=True)


def softmax_forward_fast(x, out=None):
    """softmax_forward(x, out): row maxima by halving, row sums by BLAS."""
    xp = array_module(x)
    y = xp.empty(x.shape, x.dtype) if out is None else out
    ones = xp.ones((x.shape[-1], 1), dtype=x.dtype)           # row @ ones = row sum
    for xb, yb in row_blocks(x, y):
        xp.subtract(xb, row_max(xb), out=yb)
        xp.exp(yb, out=yb)
        yb *= 1.0 / (yb @ ones)
    return y


def softmax_backward(dy, y):
    """Overwrites dy (callers pass a temporary)."""
    xp = array_module(dy)
    for dyb, yb in row_blocks(dy, y):
        dyb -= xp.einsum("ij,ij->i", dyb, yb)[:, None]     # dy_i - sum_j dy_j y_j, no (rows, n) temporary
        dyb *= yb
    return dy
