"""Exercise 18 (docs/course/10-llama.md): the backward of the rotary embedding (RoPE).

Forward, per head, for the HS features of each token (HS/2 pairs (x_i, x_{i + HS/2})):

    y = x * cos + rotate_half(x) * sin          rotate_half([x1 | x2]) = [-x2 | x1] along the last axis

cos and sin (T, HS) are constants (the tables of the tokens' positions).  Given dy = dL/dy
(B, NH, T, HS), return dx = dL/dx.  numpy only.

Check: .venv/bin/hpcpar course check 18
"""
import numpy as np  # noqa: F401


def rope_backward(dy, cos, sin):
    raise NotImplementedError
