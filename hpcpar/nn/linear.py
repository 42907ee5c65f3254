"""nn.Linear: y = x W + b with W (in, out) as in GPT-2's Conv1D."""
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.nn.parameter import Parameter, init_full
from hpcpar.ops.linear import linear_backward_input, linear_backward_weight, linear_forward


class Linear(Module):
    def __init__(self, name, d_in, d_out, std, seed, dtype, bias=True):
        self.name = name
        self.weight = Parameter(f"{name}.weight", init_full(f"{name}.weight", (d_in, d_out), std, seed, dtype))
        self.bias = Parameter(f"{name}.bias", init_full(f"{name}.bias", (d_out,), "zeros", seed, dtype)) \
            if bias else None

    def forward(self, x, ctx=None):
        """x (..., in) -> y (..., out); the cache is x itself (all dW needs)."""
        return linear_forward(x, self.weight.data, self.bias.data if self.bias else None), x

    def backward(self, dy, x, defer=None):
        run_or_defer(lambda: self.accumulate_weight_grad(dy, x), defer)
        return linear_backward_input(dy, self.weight.data)

    def accumulate_weight_grad(self, dy, x):
        dw, db = linear_backward_weight(dy, x)
        self.weight.grad += dw
        if self.bias is not None:
            self.bias.grad += db
