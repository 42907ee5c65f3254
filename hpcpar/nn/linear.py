"""nn.Linear: y = x W + b with W (in, out) as in GPT-2's Conv1D; Projections: several of one input.

Each GEMM is followed by a ``inflight.poll()`` (hpcpar/inflight.py): in the backward the gradient
all-reduces and reduce-scatters of data parallelism move on between the GEMMs; in the forward,
ZeRO-3's prefetched all-gather of the next unit, which otherwise would wait untouched until its own
wait."""
from hpcpar import inflight
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.nn.parameter import Parameter, init_full
from hpcpar.ops.linear import linear_backward_input, linear_backward_weight, linear_forward


class Linear(Module):
    mm = None               # its quantised GEMMs under an FP8/FP4 recipe (training/low_precision.py)

    def __init__(self, name, d_in, d_out, std, seed, dtype, bias=True):
        self.name = name
        self.weight = Parameter(f"{name}.weight", init_full(f"{name}.weight", (d_in, d_out), std, seed, dtype))
        self.bias = Parameter(f"{name}.bias", init_full(f"{name}.bias", (d_out,), "zeros", seed, dtype)) \
            if bias else None

    def forward(self, x, ctx=None, fp32=False):
        """x (..., in) -> y (..., out); the cache is x itself (all dW needs).  ``fp32``: y is the fp32
        sum of a low precision, unrounded (ops/linear.py)."""
        y = linear_forward(x, self.weight.data, self.bias.data if self.bias else None, fp32, self.mm)
        inflight.poll()
        return y, x

    def backward(self, dy, x, defer=None, fp32=False):
        run_or_defer(lambda: self.accumulate_weight_grad(dy, x), defer)
        dx = linear_backward_input(dy, self.weight.data, fp32, self.mm)
        inflight.poll()
        return dx

    def accumulate_weight_grad(self, dy, x):
        linear_backward_weight(dy, x, bias=self.bias is not None,
                               into=(self.weight.grad, self.bias.grad if self.bias else None), mm=self.mm)
        inflight.poll()


class Projections(Module):
    """Several linear maps of one input, kept as separate weights (Llama's q, k, v; its gate and up):

        y_i = x W_i                 x (..., in) -> [y_i (..., out_i)]
        dx  = sum_i dy_i W_i^T

    The input gradients are summed here, once, so that the tensor-parallel version
    (tensor_parallel/layers.py ColumnParallelProjections) crosses its input region once for all of
    them - as GPT-2's fused c_attn does - whatever their widths."""

    def __init__(self, *linears):
        self.parts = list(linears)

    def forward(self, x, ctx=None):
        return [part.forward(x, ctx)[0] for part in self.parts], x

    def backward(self, dys, x, defer=None):
        dx = self.parts[0].backward(dys[0], x, defer)
        for part, dy in zip(self.parts[1:], dys[1:]):
            dx += part.backward(dy, x, defer)
        return dx
