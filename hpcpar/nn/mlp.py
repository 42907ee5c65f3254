"""The transformer's feed-forward block: expand, GELU, project back, dropout.

    h = gelu(x W_fc + b_fc)      x (B, T, C) -> h (B, T, F), F = 4C by default
    y = dropout(h W_proj + b_proj)          -> y (B, T, C)

Under tensor parallelism c_fc becomes column-parallel and c_proj row-parallel (Megatron): the GELU
then acts on each rank's own columns, and one all-reduce at the end sums the partial products.
In a low precision GELU computes in fp32 on c_fc's fp32 sum (bias included) and rounds its output
once: bias and GELU are the GEMM's epilogue, as in cuBLASLt and llm.c; its backward starts from
c_proj's unrounded fp32 input gradient.
"""
import math

from hpcpar.nn.dropout import Dropout
from hpcpar.nn.linear import Linear
from hpcpar.nn.module import Module
from hpcpar.ops.activation import gelu_backward_fast, gelu_forward_fast


class MLP(Module):
    def __init__(self, prefix, d_model, d_ff, n_layer, dropout, seed, dtype, std=0.02):
        self.c_fc = Linear(f"{prefix}.c_fc", d_model, d_ff, std, seed, dtype)
        # GPT-2: residual projections scaled by 1/sqrt(2 x layers), two per block, so the residual
        # stream's variance does not grow with depth
        self.c_proj = Linear(f"{prefix}.c_proj", d_ff, d_model, std / math.sqrt(2 * n_layer), seed, dtype)
        self.drop = Dropout(f"{prefix}.dropout", dropout)

    def forward(self, x, ctx=None):
        u, c_fc = self.c_fc.forward(x, ctx, fp32=True)      # (B, T, F), this MLP's own array, fp32
        h, g = gelu_forward_fast(u, out=u)                  # (B, T, F) over u; cache g = gelu'(u)
        y, c_proj = self.c_proj.forward(h.astype(x.dtype, copy=False), ctx)     # (B, T, C)
        y, mask = self.drop.forward_tokens(y, ctx)
        return y, (g, c_fc, c_proj, mask)

    def backward(self, dy, cache, defer=None):
        g, c_fc, c_proj, mask = cache
        dy = self.drop.backward(dy, mask)
        dh = self.c_proj.backward(dy, c_proj, defer, fp32=True)            # (B, T, F), a temporary, fp32
        du = gelu_backward_fast(dh, g, out=dh).astype(dy.dtype, copy=False)
        return self.c_fc.backward(du, c_fc, defer)

