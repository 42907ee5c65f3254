"""Exercise 27, a solution: QK-norm's input gradient."""
import numpy as np


def qk_norm_dx(dy, x, g, eps=1e-6):
    rstd = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat = x * rstd
    dxhat = dy * g
    return rstd * (dxhat - xhat * np.mean(dxhat * xhat, axis=-1, keepdims=True))
