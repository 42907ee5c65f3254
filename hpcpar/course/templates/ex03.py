"""Exercise 3 (docs/course/03-tensor-parallel.md): the row-parallel layer's forward.

y = x W + b with W (in, out) cut by rows: rank i holds W_i = W[rows_i, :] and the matching columns of
the input, x_i = x[..., rows_i] (the output of a column-parallel layer).  Every rank must end with the
whole y.  Simulate all ranks at once: x_parts[i] and w_parts[i] are rank i's; the all-reduce is a sum
over ranks.  The bias b is replicated on every rank.

Check: .venv/bin/hpcpar course check 3
"""


def row_parallel_forward(x_parts, w_parts, b):
    """Returns a list with every rank's y."""
    raise NotImplementedError
