"""Llama's self-attention: separate Q, K, V projections, rotary positions on q and k, grouped-query K/V.

    q = x W_q  (B, T, NH*HS),   k = x W_k,  v = x W_v  (B, T, NKV*HS)       no biases
    q, k <- rope(q), rope(k)            each head rotated by its tokens' global positions (ops/rope.py)
    k, v <- repeat_kv(k), repeat_kv(v)  NKV -> NH heads, query head h reads K/V head h // (NH/NKV)
    o = attention(q, k, v)              the same core as GPT-2's (nn/attention_core.py), over NH full heads
    y = concat_h(o_h) W_o

The positions come from the micro-batch's context (``ctx.positions``; 0..T-1 when it gives none), so a
rank that holds a slice of the sequence rotates by the slice's own positions.  Head counts are read off
the projections' widths, so a tensor-parallel rank holding NH/tp query and NKV/tp K/V heads (q, k, v
column-parallel, o row-parallel) runs this same code: its query heads' K/V heads are its own.  The three
projections are one ``Projections`` of x: their input gradients are summed before any communication.
"""
import numpy as np

from hpcpar.backend import array_module
from hpcpar.nn.attention_core import LocalAttention
from hpcpar.nn.linear import Linear, Projections
from hpcpar.nn.module import Module
from hpcpar.ops.attention import merge_heads, split_heads
from hpcpar.ops.gqa import repeat_kv_backward, repeat_kv_forward
from hpcpar.ops.rope import rope_backward, rope_forward, rope_tables


def token_positions(ctx, T):
    """The global positions (T,) of the T tokens in hand: the context's, or 0..T-1."""
    positions = getattr(ctx, "positions", None)
    return np.arange(T) if positions is None else positions


class RotaryAttention(Module):
    def __init__(self, prefix, cfg, seed, dtype):
        C, HS = cfg.d_model, cfg.d_model // cfg.n_head
        self.head_size, self.theta = HS, cfg.rope_theta
        self.qkv = Projections(*(Linear(f"{prefix}.{name}_proj", C, heads * HS, 0.02, seed, dtype, bias=False)
                                 for name, heads in (("q", cfg.n_head), ("k", cfg.n_kv_head), ("v", cfg.n_kv_head))))
        self.o_proj = Linear(f"{prefix}.o_proj", cfg.n_head * HS, C, 0.02, seed, dtype, bias=False)
        self.selective = False          # recompute the core's probabilities in backward (attention_core.py)
        self.core = LocalAttention()    # context parallelism swaps in its ring

    def forward(self, x, ctx=None):
        (q, k, v), c_in = self.qkv.forward(x, ctx)                    # (B, T, nh*HS), (B, T, nkv*HS) twice
        HS, T = self.head_size, q.shape[1]                            # T: the whole sequence under SP
        nh, nkv = q.shape[-1] // HS, k.shape[-1] // HS               # heads on this rank
        cos, sin = rope_tables(token_positions(ctx, T), HS, self.theta, q.dtype, array_module(q))   # (T, HS)
        q = rope_forward(split_heads(q, nh), cos, sin)                # (B, nh, T, HS)
        k = rope_forward(split_heads(k, nkv), cos, sin)               # (B, nkv, T, HS)
        rep = nh // nkv
        o, c_core = self.core.forward(q, repeat_kv_forward(k, rep), repeat_kv_forward(split_heads(v, nkv), rep),
                                      lambda: None, self.selective, ctx)      # no dropout in Llama
        y, c_o = self.o_proj.forward(merge_heads(o), ctx)             # (B, T, C)
        return y, (c_in, c_core, c_o, cos, sin, nh, rep)

    def backward(self, dy, cache, defer=None):
        c_in, c_core, c_o, cos, sin, nh, rep = cache
        do = split_heads(self.o_proj.backward(dy, c_o, defer), nh)   # (B, nh, T, HS)
        dq, dk, dv = self.core.backward(do, c_core)                  # (B, nh, T, HS) each
        dq = rope_backward(dq, cos, sin)
        dk = rope_backward(repeat_kv_backward(dk, rep), cos, sin)     # (B, nkv, T, HS)
        dv = repeat_kv_backward(dv, rep)
        return self.qkv.backward([merge_heads(d) for d in (dq, dk, dv)], c_in, defer)     # (B, T, C)
