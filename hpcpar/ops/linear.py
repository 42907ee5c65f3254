"""Affine map y = x W + b, with W stored (in, out) as in GPT-2's Conv1D (and its checkpoints).

    forward         y  = x W + b                  x (..., in)  W (in, out)  b (out,)  y (..., out)
    backward_input  dx = dy W^T                   dx (..., in)
    backward_weight dW = x^T dy  (rows summed)    db = sum over rows of dy

Leading dimensions are flattened into rows first: one (N, in) x (in, out) GEMM is faster than a
stack of B smaller ones (numpy's matmul would loop over the batch).  The bias gradient is a
matrix-vector product, ones^T dy (BLAS gemv: 0.8x the time of numpy's sum over the rows at the
8-layer step's shapes, measured in docs/performance.md), and is not computed at all for a caller
without a bias.  Gradients are accumulated into the caller's arrays when it passes them (``into``):
the GEMM adds to them itself (C = A B + C), no temporary.

In a low precision (hpcpar/precision.py) each product is accumulated in fp32 and the bias added to
that sum before it is rounded once - a GEMM epilogue, as cuBLASLt's and llm.c's; ``fp32=True`` returns
the sum unrounded to an op that goes on in fp32 (the MLP's GELU).  Weight and bias gradients are summed
in fp32 straight into the fp32 gradients.

``mm``: the layer's quantised GEMMs under an FP8/FP4 recipe (fp8/gemm.py ``QuantisedGemms``), called as
``mm(which, a, b, tokens per sequence, dtype)`` for the forward, input and weight GEMMs; None: ``gemm``.
"""
from hpcpar.backend import array_module, is_device_array
from hpcpar.precision import accumulator, gemm, to_fp32


def _rows(a):
    return a.reshape(-1, a.shape[-1])


def _mm(mm, which, a, b, segment=0, dtype=None, out=None, add=False):
    """a @ b by ``gemm``, or by the layer's quantised GEMM - with gemm's contract: the sum in ``dtype``
    (None: a's), or added into ``out``."""
    if mm is None:
        return gemm(a, b, out=out, add=add, dtype=dtype)
    y = mm(which, a, b, segment, out.dtype if add else dtype)
    if add:
        out += y
        return out
    return y


def linear_forward(x, w, b=None, fp32=False, mm=None):
    """x (..., in) -> y (..., out); ``fp32``: the fp32 sum of a low precision, unrounded."""
    acc = accumulator(x.dtype)
    y = _mm(mm, "forward", _rows(x), w, dtype=acc)   # (N, out), the accumulator
    if b is not None:
        y += to_fp32(b)
    if not fp32 and y.dtype != x.dtype:
        y = y.astype(x.dtype)                    # rounded once
    return y.reshape(x.shape[:-1] + (w.shape[1],))


def linear_backward_input(dy, w, fp32=False, mm=None):
    """dx = dy W^T (..., in); ``fp32``: the fp32 sum of a low precision, unrounded."""
    dx = _mm(mm, "input", _rows(dy), w.T, dtype=accumulator(dy.dtype) if fp32 else None)
    return dx.reshape(dy.shape[:-1] + (w.shape[0],))


def linear_backward_weight(dy, x, bias=True, into=None, mm=None):
    """(dW, db) for y = x W + b, db None without ``bias``; every leading dimension of x and dy is a row
    (the tokens of each sequence: x.shape[-2] of them, for a quantised GEMM's pieces along them).
    ``into``: (dW, db) arrays to add them to (the gradients), returned."""
    dy2, x2 = _rows(dy), _rows(x)                # (N, out), (N, in)
    tokens = x.shape[-2] if x.ndim > 2 else 0
    if into is None:
        return _mm(mm, "weight", x2.T, dy2, tokens, dtype=accumulator(dy.dtype)), \
            bias_backward(dy2) if bias else None
    dw, db = into
    _mm(mm, "weight", x2.T, dy2, tokens, out=dw, add=True)     # dW += x^T dy, in the GEMM
    if bias:
        bias_backward(dy2, into=db)
    return dw, db


def bias_backward(dy, into=None):
    """db = ones^T dy (out,): the rows of dy summed, in fp32 for a low precision (added to ``into``)."""
    dy2 = _rows(dy)
    xp, acc = array_module(dy2), accumulator(dy2.dtype)
    if acc == dy2.dtype or is_device_array(dy2):     # a gemv (on a GPU: of dy widened to fp32)
        db = xp.ones(dy2.shape[0], acc) @ dy2.astype(acc, copy=False)
    else:                                        # low precision on the host: a (1, N) x (N, out) GEMM into fp32
        ones = xp.ones((1, dy2.shape[0]), dy2.dtype)                  # exact in any dtype
        if into is not None:
            gemm(ones, dy2, out=into[None], add=True)
            return into
        db = gemm(ones, dy2, dtype=acc)[0]
    if into is None:
        return db
    into += db
    return into
