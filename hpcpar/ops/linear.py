"""Affine map y = x W + b, with W stored (in, out) as in GPT-2's Conv1D (and its checkpoints).

    forward         y  = x W + b                  x (..., in)  W (in, out)  b (out,)  y (..., out)
    backward_input  dx = dy W^T                   dx (..., in)
    backward_weight dW = x^T dy  (rows summed)    db = sum over rows of dy
"""


def linear_forward(x, w, b=None):
    y = x @ w                                   # (..., out)
    if b is not None:
        y += b
    return y


def linear_backward_input(dy, w):
    return dy @ w.T                             # (..., in)


def linear_backward_weight(dy, x):
    """(dW, db) for y = x W + b; every leading dimension of x and dy is a row."""
    x2 = x.reshape(-1, x.shape[-1])             # (N, in)
    dy2 = dy.reshape(-1, dy.shape[-1])          # (N, out)
    return x2.T @ dy2, dy2.sum(axis=0)          # (in, out), (out,)
