"""nn.LayerNorm over the last axis, with learned gain and bias."""
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.nn.parameter import Parameter, init_full
from hpcpar.ops.layernorm import layernorm_backward_input, layernorm_backward_weight, layernorm_forward


class LayerNorm(Module):
    def __init__(self, name, dim, seed, dtype, eps=1e-5):
        self.weight = Parameter(f"{name}.weight", init_full(f"{name}.weight", (dim,), "ones", seed, dtype))
        self.bias = Parameter(f"{name}.bias", init_full(f"{name}.bias", (dim,), "zeros", seed, dtype))
        self.eps = eps

    def forward(self, x, ctx=None):
        return layernorm_forward(x, self.weight.data, self.bias.data, self.eps)

    def backward(self, dy, cache, defer=None):
        def weight_grad():
            dg, db = layernorm_backward_weight(dy, cache)
            self.weight.grad += dg
            self.bias.grad += db
        run_or_defer(weight_grad, defer)
        return layernorm_backward_input(dy, self.weight.data, cache)
