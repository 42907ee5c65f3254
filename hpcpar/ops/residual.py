"""The residual connection y = x + f(x): in backward the gradient reaches x twice,

    dx = dy + df(x)^T dy

once straight through (the "gradient highway" that lets deep stacks train) and once through f.
Written out as its own op only to make that visible; the blocks use ``+`` and this function's rule.
"""


def residual_forward(x, fx):
    return x + fx


def residual_backward(dy, dx_through_f):
    return dy + dx_through_f
