"""nn.LayerNorm over the last axis, with learned gain and bias.  In a low precision it computes in
fp32 (statistics of a row need more than 8 or 11 bits) and rounds its output once."""
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.nn.parameter import Parameter, init_full
from hpcpar.ops.layernorm import layernorm_backward, layernorm_forward
from hpcpar.precision import to_fp32


class LayerNorm(Module):
    def __init__(self, name, dim, seed, dtype, eps=1e-5):
        self.weight = Parameter(f"{name}.weight", init_full(f"{name}.weight", (dim,), "ones", seed, dtype))
        self.bias = Parameter(f"{name}.bias", init_full(f"{name}.bias", (dim,), "zeros", seed, dtype))
        self.eps = eps

    def forward(self, x, ctx=None):
        y, cache = layernorm_forward(to_fp32(x), to_fp32(self.weight.data), to_fp32(self.bias.data), self.eps)
        return y.astype(x.dtype, copy=False), cache

    def backward(self, dy, cache, defer=None):
        dx, dg, db = layernorm_backward(to_fp32(dy), to_fp32(self.weight.data), cache)

        def weight_grad():              # computed with dx (one pass), added now or in a later W pass
            self.weight.grad += dg
            self.bias.grad += db
        run_or_defer(weight_grad, defer)
        return dx.astype(dy.dtype, copy=False)
