"""Llama's feed-forward block: a gated projection up, SwiGLU, a projection down; no biases, no dropout.

    a = x W_gate,  u = x W_up       x (B, T, C) -> (B, T, F)
    h = silu(a) u                   (ops/swiglu.py)
    y = h W_down                    -> (B, T, C)

Under tensor parallelism gate_proj and up_proj are both column-parallel (each rank holds the same F/tp
columns of both, so the product pairs up locally) and down_proj row-parallel: one all-reduce at the end,
as in GPT-2's MLP.  Names and roles as in Hugging Face's LlamaMLP.
"""
from hpcpar.nn.linear import Linear
from hpcpar.nn.module import Module
from hpcpar.ops.swiglu import swiglu_backward, swiglu_forward
from hpcpar.precision import to_fp32


class SwiGLU(Module):
    def __init__(self, prefix, d_model, d_ff, seed, dtype, std=0.02):
        self.gate_proj = Linear(f"{prefix}.gate_proj", d_model, d_ff, std, seed, dtype, bias=False)
        self.up_proj = Linear(f"{prefix}.up_proj", d_model, d_ff, std, seed, dtype, bias=False)
        self.down_proj = Linear(f"{prefix}.down_proj", d_ff, d_model, std, seed, dtype, bias=False)

    def forward(self, x, ctx=None):
        a, c_gate = self.gate_proj.forward(x, ctx)                  # (B, T, F)
        u, c_up = self.up_proj.forward(x, ctx)                      # (B, T, F)
        a32, u32 = to_fp32(a), to_fp32(u)
        h, c_act = swiglu_forward(a32, u32)                         # (B, T, F)
        y, c_down = self.down_proj.forward(h.astype(a.dtype, copy=False), ctx)     # (B, T, C)
        return y, (a32, u32, c_act, c_gate, c_up, c_down)

    def backward(self, dy, cache, defer=None):
        a32, u32, c_act, c_gate, c_up, c_down = cache
        dh = self.down_proj.backward(dy, c_down, defer)             # (B, T, F)
        da, du = swiglu_backward(to_fp32(dh), a32, u32, c_act)
        dx = self.gate_proj.backward(da.astype(dh.dtype, copy=False), c_gate, defer)      # (B, T, C)
        dx += self.up_proj.backward(du.astype(dh.dtype, copy=False), c_up, defer)
        return dx
