"""nn.RMSNorm over the last axis, with a learned gain and no bias (Llama).  Like LayerNorm it computes
in fp32 under a low precision and rounds its output once."""
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.nn.parameter import Parameter, init_full
from hpcpar.ops.rmsnorm import rmsnorm_backward_input, rmsnorm_backward_weight, rmsnorm_forward
from hpcpar.precision import to_fp32


class RMSNorm(Module):
    def __init__(self, name, dim, seed, dtype, eps=1e-6):
        self.weight = Parameter(f"{name}.weight", init_full(f"{name}.weight", (dim,), "ones", seed, dtype))
        self.eps = eps

    def forward(self, x, ctx=None):
        y, cache = rmsnorm_forward(to_fp32(x), to_fp32(self.weight.data), self.eps)    # (..., C)
        return y.astype(x.dtype, copy=False), cache

    def backward(self, dy, cache, defer=None):
        dy32 = to_fp32(dy)

        def weight_grad():
            self.weight.grad += rmsnorm_backward_weight(dy32, cache)
        run_or_defer(weight_grad, defer)
        return rmsnorm_backward_input(dy32, to_fp32(self.weight.data), cache).astype(dy.dtype, copy=False)
