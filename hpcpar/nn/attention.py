"""Causal self-attention block: fused QKV projection, per-head attention, output projection.

    [Q | K | V] = x W_attn + b_attn         x (B, T, C) -> (B, T, 3C)
    O_h = attention(Q_h, K_h, V_h)          each head h on its HS = C / NH columns
    y = dropout(concat_h(O_h) W_proj + b_proj)

The head count is read off the projection's output width, so the same code runs on a tensor-parallel
rank that holds only NH / tp heads (c_attn column-parallel, c_proj row-parallel).  The core, O from
(Q, K, V), is an object of its own (``self.core``): context parallelism swaps it for ring or Ulysses
attention (hpcpar/context_parallel/) and keeps everything around it.
"""
import math

from hpcpar.backend import array_module
from hpcpar.nn.dropout import Dropout
from hpcpar.nn.linear import Linear
from hpcpar.nn.module import Module
from hpcpar.nn.attention_core import LocalAttention, attention_mask
from hpcpar.ops.attention import attention_cached_forward, merge_heads, split_heads


class Attention(Module):
    def __init__(self, prefix, d_model, n_head, n_layer, dropout, seed, dtype):
        self.head_size = d_model // n_head
        self.n_head = n_head            # heads of the whole layer
        self.head_offset = 0            # first head on this rank (tensor parallelism moves it)
        self.c_attn = Linear(f"{prefix}.c_attn", d_model, 3 * d_model, 0.02, seed, dtype)
        self.c_attn.weight.fused = 3                                   # [Q | K | V]: three matrices to Muon
        self.c_proj = Linear(f"{prefix}.c_proj", d_model, d_model, 0.02 / math.sqrt(2 * n_layer), seed, dtype)
        self.attn_drop = Dropout(f"{prefix}.attn_dropout", dropout)
        self.resid_drop = Dropout(f"{prefix}.resid_dropout", dropout)
        self.selective = False          # recompute the core's probabilities in backward (attention_core.py)
        self.core = LocalAttention()    # context parallelism swaps in its ring or Ulysses
        self.window = 0                 # sliding window of this layer (ops/masks.py; 0: none)

    def forward(self, x, ctx=None):
        qkv, c_attn = self.c_attn.forward(x, ctx)             # (B, T, 3 * C_local)
        B, T, three_c = qkv.shape
        c = three_c // 3
        nh = c // self.head_size                              # heads on this rank
        q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], nh) for i in range(3))   # (B, nh, T, HS)
        heads = slice(self.head_offset, self.head_offset + nh)
        xp = array_module(x)
        o, c_core = self.core.forward(q, k, v, lambda: self.attn_drop.mask(ctx, B, (self.n_head, T, T), (heads,),
                                                                           x.dtype, xp), self.selective, ctx,
                                    attn_mask=attention_mask(ctx, self.window))
        # o: (B, nh, T, HS)
        y, c_proj = self.c_proj.forward(merge_heads(o), ctx)  # (B, T, C)
        y, mask = self.resid_drop.forward_tokens(y, ctx)
        return y, (c_attn, c_core, c_proj, mask, nh)

    def heads_here(self):
        """The heads this rank holds (all of them, or its share under tensor parallelism)."""
        return self.c_attn.weight.data.shape[-1] // (3 * self.head_size)

    def qk_scales(self, gamma, alpha=0.5):
        """QK-clip (training/qk_clip.py): [(parameter, a multiplier per output column)] that scale head h's
        logits by gamma[h] (gamma: this rank's heads): its query columns by gamma^alpha, its key columns by
        gamma^(1 - alpha) - weight and bias alike, both make q and k."""
        xp, HS = array_module(gamma), self.head_size
        cols = xp.concatenate([xp.repeat(gamma ** alpha, HS), xp.repeat(gamma ** (1 - alpha), HS),
                               xp.ones(len(gamma) * HS)])                   # [Q | K | V]
        return [(self.c_attn.weight, cols), (self.c_attn.bias, cols)]

    def forward_cached(self, x, kv, start):
        """Forward only, for generation: x (B, T, C) of the tokens at positions [start, start + T);
        ``kv`` = (k_cache, v_cache), each (B, NH, T_max, HS), gains their keys and values."""
        qkv, _ = self.c_attn.forward(x)                       # (B, T, 3C)
        c = qkv.shape[-1] // 3
        q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], c // self.head_size) for i in range(3))
        o = attention_cached_forward(q, k, v, kv[0], kv[1], start, self.window)
        return self.c_proj.forward(merge_heads(o))[0]          # (B, T, C)

    def cache_shapes(self, batch, length):
        """The keys and values ``forward_cached`` keeps per layer: (B, NH, length, HS) each."""
        return ((batch, self.n_head, length, self.head_size),) * 2

    def backward(self, dy, cache, defer=None):
        c_attn, c_core, c_proj, mask, nh = cache
        dy = self.resid_drop.backward(dy, mask)
        do = split_heads(self.c_proj.backward(dy, c_proj, defer), nh)       # (B, nh, T, HS)
        B, _, T, HS = do.shape
        dqkv = array_module(dy).empty((B, T, 3, nh, HS), dtype=dy.dtype)                    # [dQ | dK | dV]
        self.core.backward(do, c_core, out=[dqkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)])
        return self.c_attn.backward(dqkv.reshape(B, T, 3 * nh * HS), c_attn, defer)
