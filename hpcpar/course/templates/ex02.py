"""Exercise 2 (docs/course/03-tensor-parallel.md): the column-parallel layer's backward.

y = x W + b with W (in, out) cut by columns: rank i holds W_i = W[:, cols_i] and b_i, and computes
y_i = x W_i + b_i (its columns of y).  In the backward it receives dy_i = dL/dy_i (its columns only).
Return what this rank can compute on its own:

    dx_part  its share of dL/dx (the f operator's all-reduce sums the shares of all ranks)
    dw_part  dL/dW_i
    db_part  dL/db_i

Shapes: x (..., in), w_part (in, out_i), dy_part (..., out_i).  numpy only.

Check: .venv/bin/hpcpar course check 2
"""


def column_parallel_backward(x, w_part, dy_part):
    raise NotImplementedError
