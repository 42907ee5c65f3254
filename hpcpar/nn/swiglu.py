"""Llama's feed-forward block: a gated projection up, SwiGLU, a projection down; no biases, no dropout.

    a = x W_gate,  u = x W_up       x (B, T, C) -> (B, T, F)
    h = silu(a) u                   (ops/swiglu.py)
    y = h W_down                    -> (B, T, C)

Under tensor parallelism gate_proj and up_proj are both column-parallel (each rank holds the same F/tp
columns of both, so the product pairs up locally) and down_proj row-parallel: one all-reduce at the end,
as in GPT-2's MLP.  gate and up are one ``Projections`` of x, so the backward, too, communicates once.
Names and roles as in Hugging Face's LlamaMLP.
"""
from hpcpar.nn.linear import Linear, Projections
from hpcpar.nn.module import Module
from hpcpar.ops.swiglu import swiglu_backward, swiglu_forward
from hpcpar.precision import to_fp32


class SwiGLU(Module):
    def __init__(self, prefix, d_model, d_ff, seed, dtype, std=0.02):
        self.gate_up = Projections(Linear(f"{prefix}.gate_proj", d_model, d_ff, std, seed, dtype, bias=False),
                                   Linear(f"{prefix}.up_proj", d_model, d_ff, std, seed, dtype, bias=False))
        self.down_proj = Linear(f"{prefix}.down_proj", d_ff, d_model, std, seed, dtype, bias=False)

    def forward(self, x, ctx=None):
        (a, u), c_in = self.gate_up.forward(x, ctx)                 # (B, T, F) each
        a32, u32 = to_fp32(a), to_fp32(u)
        h, c_act = swiglu_forward(a32, u32)                         # (B, T, F)
        y, c_down = self.down_proj.forward(h.astype(a.dtype, copy=False), ctx)     # (B, T, C)
        return y, (a32, u32, c_act, c_in, c_down)

    def backward(self, dy, cache, defer=None):
        a32, u32, c_act, c_in, c_down = cache
        dh = self.down_proj.backward(dy, c_down, defer)             # (B, T, F)
        da, du = swiglu_backward(to_fp32(dh), a32, u32, c_act)
        return self.gate_up.backward([d.astype(dh.dtype, copy=False) for d in (da, du)], c_in, defer)   # (B, T, C)
