"""Newton-Schulz: Muon's orthogonalisation, five small polynomials in a matrix instead of an SVD.

Muon (optim/muon.py) moves a weight matrix along the semi-orthogonal matrix nearest to its momentum
G = U S V^T: U V^T, every singular value set to 1.  Newton-Schulz gets there with matrix products
only.  X0 = G / ||G||_F puts every singular value in (0, 1]; then, for X (r, c) with r <= c,

    A = X X^T                     (r, r)   the Gram matrix
    B = b A + c A A               (r, r)
    X <- a X + B X                (r, c)   = a X + b (X X^T) X + c (X X^T)^2 X

maps each singular value s to p(s) = a s + b s^3 + c s^5 and leaves U and V alone.  The quintic
coefficients (a, b, c) = (3.4445, -4.7750, 2.0315) (Keller Jordan's, PyTorch's torch.optim.Muon) make
p steep at 0: five steps take every s in [1e-3, 1] into about [0.7, 1.2] - not exactly 1, and for
training that is enough (an update U S' V^T).  A tall matrix runs on its transpose: the Gram is then
the small side's, r <= c.

Which Gram.  (X X^T) X = X (X^T X), so the same polynomial runs with the Gram over either side:

    over axis 1 (columns):  A = X X^T  (r, r);   X <- a X + (b A + c A^2) X
    over axis 0 (rows):     A = X^T X  (c, c);   X <- a X + X (b A + c A^2)

``newton_schulz`` below is the plain iteration on one whole matrix, PyTorch's lines (the Gram over
the longer side, the small one).  ``newton_schulz_cut`` runs the same on matrices cut across ranks
along the axis the Gram contracts: each rank forms the Gram of its piece, ``total`` sums them over the
ranks (an all-reduce; nothing alone), and each rank updates its own piece - tensor parallelism's
*distributed* mode (tensor_parallel/muon.py).  The squared Frobenius norm is summed the same way, and
all the matrices of one call share each sum: steps + 1 sums per call, however many matrices.

Precision: the working dtype (float32 or float64), or bf16 as PyTorch does (``dtype``): X, A and B
are then rounded to bf16 after each product, which multiplies in fp32 (precision.gemm's contract).
"""
import math

import numpy as np

from hpcpar.backend import array_module
from hpcpar.precision import accumulator

COEFFICIENTS = (3.4445, -4.7750, 2.0315)
EPS = 1e-7                  # the norm's floor: a zero matrix stays zero


def newton_schulz(g, steps=5, coefficients=COEFFICIENTS, eps=EPS, dtype=None):
    """The orthogonalised g (r, c): ``steps`` quintic iterations, in ``dtype`` (default g's)."""
    a, b, c = coefficients
    x = g.astype(dtype or g.dtype)
    tall = g.shape[0] > g.shape[1]
    if tall:
        x = x.T                                                 # (c, r): the short side first
    x = _round(_up(x) / max(float(np.sqrt(_sum_sq(x))), eps), x.dtype)
    for _ in range(steps):
        x32 = _up(x)
        A = _round(x32 @ x32.T, x.dtype)                        # A = X X^T
        A32 = _up(A)
        B = _up(_round(b * A32 + c * (A32 @ A32), x.dtype))     # B = b A + c A^2
        x = _round(a * x32 + B @ x32, x.dtype)                  # X = a X + B X
    return x.T if tall else x


def newton_schulz_cut(pieces, axes, total=None, steps=5, coefficients=COEFFICIENTS, eps=EPS, dtype=None):
    """Orthogonalise matrices cut across ranks: ``pieces`` this rank's parts, ``axes[i]`` the axis piece i
    is cut along (the one its Gram contracts), ``total(flat)`` the sum of a flat array over the ranks
    that hold the other parts (None: one rank, the pieces are whole).  -> this rank's parts of the results.
    One call, one sum per iteration for all the pieces (their Grams side by side in one array)."""
    a, b, c = coefficients
    total = total or (lambda v: v)
    xs = [p.astype(dtype or p.dtype) for p in pieces]
    xp = array_module(pieces[0])
    norms = total(xp.stack([_sum_sq(x) for x in xs]).astype(accumulator(xs[0].dtype)))
    xs = [_round(_up(x) / max(math.sqrt(float(n)), eps), x.dtype) for x, n in zip(xs, norms)]
    for _ in range(steps):
        x32 = [_up(x) for x in xs]
        grams = [x @ x.T if axis == 1 else x.T @ x for x, axis in zip(x32, axes)]
        summed = total(xp.concatenate([gm.reshape(-1) for gm in grams]))   # every rank's pieces' Grams
        at, out = 0, []
        for x, x_low, gm, axis in zip(x32, xs, grams, axes):
            A = _up(_round(summed[at:at + gm.size].reshape(gm.shape), x_low.dtype))
            at += gm.size
            B = _up(_round(b * A + c * (A @ A), x_low.dtype))
            out.append(_round(a * x + (B @ x if axis == 1 else x @ B), x_low.dtype))
        xs = out
    return xs


def gram_axis(shape):
    """The axis the plain iteration's Gram contracts: the longer one (PyTorch's choice; a square
    matrix: axis 1)."""
    return 0 if shape[0] > shape[1] else 1


def _sum_sq(x):
    x = _up(x).reshape(-1)
    return x @ x


def _up(x):
    """x in the dtype its products are computed in: fp32 for bf16, else x itself."""
    return x.astype(accumulator(x.dtype), copy=False)


def _round(y, dtype):
    """y rounded to the iteration's dtype (nothing to do unless that is bf16)."""
    return y.astype(dtype, copy=False)
