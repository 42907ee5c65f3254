"""Affine map y = x W + b, with W stored (in, out) as in GPT-2's Conv1D (and its checkpoints).

    forward         y  = x W + b                  x (..., in)  W (in, out)  b (out,)  y (..., out)
    backward_input  dx = dy W^T                   dx (..., in)
    backward_weight dW = x^T dy  (rows summed)    db = sum over rows of dy

Leading dimensions are flattened into rows first: one (N, in) x (in, out) GEMM is faster than a
stack of B smaller ones (numpy's matmul would loop over the batch).  The bias gradient is a
matrix-vector product, ones^T dy (BLAS gemv: 0.8x the time of numpy's sum over the rows at the
8-layer step's shapes, measured in docs/performance.md), and is not computed at all for a caller
without a bias.  In a low precision the GEMMs round their output once and the bias gradient is
summed in fp32 (hpcpar/precision.py).

``mm``: the layer's quantised GEMMs under an FP8/FP4 recipe (fp8/gemm.py ``QuantisedGemms``), called as
``mm(which, a, b, tokens per sequence)`` for the forward, input and weight GEMMs; None: ``gemm``.
"""
from hpcpar.backend import array_module
from hpcpar.precision import accumulator, gemm


def _rows(a):
    return a.reshape(-1, a.shape[-1])


def _mm(mm, which, a, b, segment=0):
    return gemm(a, b) if mm is None else mm(which, a, b, segment)


def linear_forward(x, w, b=None, mm=None):
    y = _mm(mm, "forward", _rows(x), w)         # (N, out)
    if b is not None:
        y += b
    return y.reshape(x.shape[:-1] + (w.shape[1],))


def linear_backward_input(dy, w, mm=None):
    return _mm(mm, "input", _rows(dy), w.T).reshape(dy.shape[:-1] + (w.shape[0],))    # (..., in)


def linear_backward_weight(dy, x, bias=True, mm=None):
    """(dW, db) for y = x W + b, db None without ``bias``; every leading dimension of x and dy is a row
    (the tokens of each sequence: x.shape[-2] of them, for a quantised GEMM's pieces along them)."""
    dy2 = _rows(dy)                             # (N, out)
    dw = _mm(mm, "weight", _rows(x).T, dy2, x.shape[-2] if x.ndim > 2 else 0)
    return dw, bias_backward(dy2) if bias else None    # (in, out), (out,)


def bias_backward(dy):
    """db = ones^T dy (out,): the rows of dy summed, in fp32 for a low precision."""
    dy2 = _rows(dy)
    acc = accumulator(dy2.dtype)
    return array_module(dy2).ones(dy2.shape[0], acc) @ dy2.astype(acc, copy=False)
