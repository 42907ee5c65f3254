"""The E expert MLPs of a mixture of experts, weights stacked, applied as grouped GEMMs (ops/moe.py).

Rows arrive sorted by expert (xs (M, C), local expert e's rows offsets[e]:offsets[e + 1]); each expert
is its family's dense MLP, on its own rows only.  Under expert parallelism a rank holds only its E / ep
experts (the first dimension of every weight below is then E / ep: hpcpar/expert_parallel/dispatch.py
cuts it), and the rows it is given are theirs.

    GELU (GPT-2 family):   ys = gelu(xs W_fc[e] + b_fc[e]) W_proj[e] + b_proj[e]
                           W_fc (E, C, F), b_fc (E, F), W_proj (E, F, C), b_proj (E, C)
    SwiGLU (Llama family): [a | u] = xs W_gate_up[e],   ys = (silu(a) u) W_down[e]
                           W_gate_up (E, C, 2F) (gate columns first), W_down (E, F, C)

The SwiGLU weight is stored as transformers' Mixtral/Qwen-MoE experts store theirs (gate_up_proj,
down_proj), transposed to our (in, out) layout; one (in, 2F) GEMM per expert computes both halves.
In a low precision the activation computes in fp32 and rounds its output (as the dense MLPs do).
"""
import math

from hpcpar.backend import array_module
from hpcpar.nn.mlp import MLP
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.nn.parameter import Parameter, init_full
from hpcpar.nn.swiglu import SwiGLU
from hpcpar.ops.activation import gelu_backward, gelu_forward
from hpcpar.ops.moe import grouped_backward_input, grouped_backward_weight, grouped_forward
from hpcpar.ops.swiglu import swiglu_backward, swiglu_forward
from hpcpar.precision import to_fp32


def _param(name, shape, std, seed, dtype, decay=None):
    return Parameter(name, init_full(name, shape, std, seed, dtype), decay)


class GeluExperts(Module):
    def __init__(self, prefix, n_expert, d_model, d_ff, n_layer, seed, dtype, std=0.02):
        E, C, F = n_expert, d_model, d_ff
        self.fc_w = _param(f"{prefix}.c_fc.weight", (E, C, F), std, seed, dtype)
        self.fc_b = _param(f"{prefix}.c_fc.bias", (E, F), "zeros", seed, dtype, decay=False)
        # GPT-2's residual projection scaling, as in its dense MLP (nn/mlp.py)
        self.proj_w = _param(f"{prefix}.c_proj.weight", (E, F, C), std / math.sqrt(2 * n_layer), seed, dtype)
        self.proj_b = _param(f"{prefix}.c_proj.bias", (E, C), "zeros", seed, dtype, decay=False)

    @staticmethod
    def shared(prefix, cfg, width, seed, dtype):
        """The family's dense MLP of width ``width``: the shared experts (no dropout of its own)."""
        return MLP(prefix, cfg.d_model, width, cfg.n_layer, 0.0, seed, dtype)

    def forward(self, xs, offsets, ctx=None):
        u = grouped_forward(xs, self.fc_w.data, offsets, self.fc_b.data)       # (M, F)
        h, t = gelu_forward(to_fp32(u))
        h = h.astype(u.dtype, copy=False)
        return grouped_forward(h, self.proj_w.data, offsets, self.proj_b.data), (xs, offsets, u, t, h)

    def backward(self, dys, cache, defer=None):
        xs, offsets, u, t, h = cache
        run_or_defer(lambda: self._grad(self.proj_w, self.proj_b, dys, h, offsets), defer)
        dh = grouped_backward_input(dys, self.proj_w.data, offsets)             # (M, F)
        du = gelu_backward(to_fp32(dh), to_fp32(u), t).astype(dh.dtype, copy=False)
        run_or_defer(lambda: self._grad(self.fc_w, self.fc_b, du, xs, offsets), defer)
        return grouped_backward_input(du, self.fc_w.data, offsets)              # (M, C)

    @staticmethod
    def _grad(w, b, dy, x, offsets):
        grouped_backward_weight(dy, x, offsets, w.grad, b.grad)


class SwiGLUExperts(Module):
    def __init__(self, prefix, n_expert, d_model, d_ff, n_layer, seed, dtype, std=0.02):
        E, C, F = n_expert, d_model, d_ff
        self.d_ff = F
        self.gate_up = _param(f"{prefix}.gate_up_proj", (E, C, 2 * F), std, seed, dtype)
        self.gate_up.fused = 2                                         # [gate | up]: two matrices to Muon
        self.down = _param(f"{prefix}.down_proj", (E, F, C), std, seed, dtype)

    @staticmethod
    def shared(prefix, cfg, width, seed, dtype):
        """The family's dense MLP of width ``width``: the shared experts."""
        return SwiGLU(prefix, cfg.d_model, width, seed, dtype)

    def forward(self, xs, offsets, ctx=None):
        F = self.d_ff
        au = grouped_forward(xs, self.gate_up.data, offsets)                   # (M, 2F)
        a32, u32 = to_fp32(au[:, :F]), to_fp32(au[:, F:])
        h, c_act = swiglu_forward(a32, u32)
        h = h.astype(au.dtype, copy=False)
        return grouped_forward(h, self.down.data, offsets), (xs, offsets, a32, u32, c_act, h)

    def backward(self, dys, cache, defer=None):
        xs, offsets, a32, u32, c_act, h = cache
        run_or_defer(lambda: self._grad(self.down, dys, h, offsets), defer)
        dh = grouped_backward_input(dys, self.down.data, offsets)               # (M, F)
        F = self.d_ff
        dau = array_module(dh).empty((dh.shape[0], 2 * F), a32.dtype)          # (M, 2F): [da | du]
        swiglu_backward(to_fp32(dh), a32, u32, c_act, out=(dau[:, :F], dau[:, F:]))
        dau = dau.astype(dh.dtype, copy=False)
        run_or_defer(lambda: self._grad(self.gate_up, dau, xs, offsets), defer)
        return grouped_backward_input(dau, self.gate_up.data, offsets)          # (M, C)

    @staticmethod
    def _grad(w, dy, x, offsets):
        grouped_backward_weight(dy, x, offsets, w.grad)
