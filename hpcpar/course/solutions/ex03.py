"""Exercise 3, a solution: the row-parallel layer's forward."""


def row_parallel_forward(x_parts, w_parts, b):
    y = sum(x @ w for x, w in zip(x_parts, w_parts)) + b       # the all-reduce, then the bias once
    return [y.copy() for _ in x_parts]
