"""Exercise 42 (docs/course/17-muon.md): Newton-Schulz, Muon's orthogonalisation.

Muon steps a weight matrix along U V^T, where G = U S V^T is its momentum: every singular value set to
1.  Newton-Schulz gets close with matrix products only.  Scale G so that every singular value is at most
1, X = G / max(||G||_F, eps), then repeat ``steps`` times, for X (r, c) with r <= c:

    A = X X^T                   the Gram matrix, (r, r)
    B = b A + c A A
    X = a X + B X               each singular value s becomes a s + b s^3 + c s^5

with (a, b, c) = (3.4445, -4.7750, 2.0315) and eps = 1e-7.  A tall G (more rows than columns) is
iterated as its transpose, and the result transposed back.  Return the result, G's shape and dtype;
leave G itself as it is.  numpy only.

Check: .venv/bin/hpcpar course check 42
"""
import numpy as np  # noqa: F401


def newton_schulz(g, steps):
    raise NotImplementedError
