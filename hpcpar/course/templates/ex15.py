"""Exercise 15 (docs/course/03-tensor-parallel.md): a tensor-parallel MLP on MPI ranks.

    h = tanh(x W1 + b1)        W1 (C, H) cut by columns: this rank holds w1 = W1[:, cols], b1 = b1[cols]
    y = h W2 + b2              W2 (H, C) cut by rows:    this rank holds w2 = W2[cols, :]; b2 replicated

The function below is the layer's forward and backward as one rank without tensor parallelism would
write them.  On tp ranks each holds only its columns/rows, and every rank must end with the whole y
and the whole dx = dL/dx (dy = dL/dy is the same on every rank).  Add the all-reduces where they are
needed, and only there - `y = comm.all_reduce(partial)` sums an array over the ranks - and make sure
the replicated bias counts once.  The check compares y and dx with the one-rank layer and counts the
all-reduces and their bytes.

Check: .venv/bin/hpcpar course check 15           (it starts mpiexec -n 4)
"""
import numpy as np


def tp_mlp(comm, x, w1, b1, w2, b2, dy):
    """x, dy (B, T, C); w1 (C, H/tp), b1 (H/tp,), w2 (H/tp, C), b2 (C,) -> (y, dx), both (B, T, C)"""
    h = np.tanh(x @ w1 + b1)                  # (B, T, H/tp)
    y = h @ w2 + b2                           # (B, T, C)
    dh = dy @ w2.T                            # (B, T, H/tp)
    dx = (dh * (1 - h * h)) @ w1.T            # (B, T, C)
    return y, dx
