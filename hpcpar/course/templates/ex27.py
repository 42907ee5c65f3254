"""Exercise 27 (docs/course/10-llama.md): the input gradient of QK-norm.

QK-norm (Qwen3) normalises the queries and the keys per head, after their projections: RMSNorm over
the HS features of each (b, head, t) row, with one gain per feature shared by all the heads.  For x
the queries (B, NH, T, HS) or the keys (B, NKV, T, HS):

    rstd = 1 / sqrt(mean_i x_i^2 + eps)      per row: the mean over the last axis
    xhat = x * rstd,    y = xhat * g         g (HS,)

Given dy = dL/dy (the shape of x), x, g and eps, return dx = dL/dx.  numpy only, float64.

Check: .venv/bin/hpcpar course check 27
"""
import numpy as np  # noqa: F401


def qk_norm_dx(dy, x, g, eps=1e-6):
    raise NotImplementedError
