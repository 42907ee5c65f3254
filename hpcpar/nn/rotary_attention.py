"""Llama's self-attention: separate Q, K, V projections, rotary positions on q and k, grouped-query K/V.

    q = x W_q  (B, T, NH*HS),   k = x W_k,  v = x W_v  (B, T, NKV*HS)       no biases
    q, k <- rmsnorm(q), rmsnorm(k)      per head over its HS features, with ``qk_norm`` (Qwen3, ops/qk_norm.py)
    q, k <- rope(q), rope(k)            each head rotated by its tokens' global positions (ops/rope.py)
    o = attention(q, k, v)              the same core as GPT-2's (nn/attention_core.py), given the NKV K/V
                                        heads: it repeats them to NH, query head h reads K/V head h // (NH/NKV)
    y = concat_h(o_h) W_o               W_o (NH*HS, C)

HS is the model's head_dim: C / NH by default, any even width given (Qwen3's 128 over C = 2048, NH = 32):
the projections map C to NH*HS and NKV*HS and back, and nothing after them reads C.

The positions come from the micro-batch's context (``ctx.positions``; 0..T-1 when it gives none), so a
rank that holds a slice of the sequence rotates by the slice's own positions; with documents
(``ctx.docs``) each token by its place in its own document (B, T), restarting at each start.  Head counts are read off
the projections' widths, so a tensor-parallel rank holding NH/tp query and NKV/tp K/V heads (q, k, v
column-parallel, o row-parallel) runs this same code: its query heads' K/V heads are its own, and QK-norm,
per head, needs no other rank (its gains' gradients are partial sums over TP, ``Parts.tp_per_head``).  The three
projections are one ``Projections`` of x: their input gradients are summed before any communication.

Generation (``forward_cached``) rotates the new tokens' q and k at their absolute positions and keeps
the NKV heads' keys and values in a KV cache (ops/attention.py ``attention_cached_forward``).
"""
from hpcpar.backend import array_module
from hpcpar.nn.attention_core import LocalAttention, attention_mask
from hpcpar.nn.linear import Linear, Projections
from hpcpar.nn.module import Module
from hpcpar.nn.qk_norm import QKNorm
from hpcpar.ops.attention import attention_cached_forward, merge_heads, split_heads
from hpcpar.ops.masks import token_positions as place
from hpcpar.ops.rope import rope_backward, rope_forward, rope_tables


def token_positions(ctx, T):
    """The positions of the T tokens in hand RoPE rotates by: their global positions (T,) (the
    context's, or 0..T-1), or with documents their places in their documents (B, T)."""
    return place(getattr(ctx, "docs", None), getattr(ctx, "positions", None), T)


class RotaryAttention(Module):
    def __init__(self, prefix, cfg, seed, dtype):
        C, HS = cfg.d_model, cfg.head_size          # NH*HS need not be C (Qwen3: HS 128 whatever C / NH)
        self.head_size, self.theta = HS, cfg.rope_theta
        self.qkv = Projections(*(Linear(f"{prefix}.{name}_proj", C, heads * HS, 0.02, seed, dtype, bias=False)
                                 for name, heads in (("q", cfg.n_head), ("k", cfg.n_kv_head), ("v", cfg.n_kv_head))))
        self.o_proj = Linear(f"{prefix}.o_proj", cfg.n_head * HS, C, 0.02, seed, dtype, bias=False)
        self.qk_norm = QKNorm(prefix, HS, seed, dtype, cfg.ln_eps) if cfg.qk_norm else None
        self.selective = False          # recompute the core's probabilities in backward (attention_core.py)
        self.core = LocalAttention()    # context parallelism swaps in its ring or Ulysses
        self.window = 0                 # sliding window of this layer (ops/masks.py; 0: none)

    def rotated_heads(self, x, ctx=None, start=0):
        """q (B, nh, T, HS), k, v (B, nkv, T, HS) of x (B, T, C), q and k normalised (``qk_norm``) and rotated
        by the tokens' positions (the context's, else start .. start + T - 1); the tables cos, sin (T, HS);
        the projections' and the norm's caches."""
        (q, k, v), c_in = self.qkv.forward(x, ctx)                    # (B, T, nh*HS), (B, T, nkv*HS) twice
        HS, T = self.head_size, q.shape[1]                            # T: the whole sequence under SP
        q, k, v = (split_heads(a, a.shape[-1] // HS) for a in (q, k, v))     # heads on this rank
        c_qk = None
        if self.qk_norm is not None:
            q, k, c_qk = self.qk_norm.forward(q, k)
        cos, sin = rope_tables(start + token_positions(ctx, T), HS, self.theta, q.dtype, array_module(q))
        if cos.ndim == 3:                                             # per sequence: (B, 1, T, HS) over heads
            cos, sin = cos[:, None], sin[:, None]
        return rope_forward(q, cos, sin), rope_forward(k, cos, sin), v, cos, sin, (c_in, c_qk)

    def forward(self, x, ctx=None):
        q, k, v, cos, sin, c_in = self.rotated_heads(x, ctx)      # c_in: the projections' and QK-norm's
        nh, rep = q.shape[1], q.shape[1] // k.shape[1]
        o, c_core = self.core.forward(q, k, v, lambda: None, self.selective, ctx, rep,   # no dropout in Llama
                                      attn_mask=attention_mask(ctx, self.window))
        y, c_o = self.o_proj.forward(merge_heads(o), ctx)             # (B, T, C)
        return y, (c_in, c_core, c_o, cos, sin, nh)

    def heads_here(self):
        """The query heads this rank holds (all of them, or its share under tensor parallelism)."""
        return self.qkv.parts[0].weight.data.shape[-1] // self.head_size

    def qk_scales(self, gamma, alpha=0.5):
        """QK-clip (training/qk_clip.py): [(parameter, a multiplier per output column)] that scale query head
        h's logits by gamma[h] (this rank's heads).  One key head per query head: W_q's head by gamma^alpha,
        W_k's by gamma^(1 - alpha).  Grouped keys (NH / NKV query heads share one): the key is left alone
        and the query head takes all of gamma_h, as Kimi K2's MuonClip treats the key MLA shares between
        heads - so clipping one head never moves its neighbours' logits."""
        xp, HS = array_module(gamma), self.head_size
        q, k = self.qkv.parts[0].weight, self.qkv.parts[1].weight
        if k.data.shape[-1] // HS == len(gamma):
            return [(q, xp.repeat(gamma ** alpha, HS)), (k, xp.repeat(gamma ** (1 - alpha), HS))]
        return [(q, xp.repeat(gamma, HS))]

    def forward_cached(self, x, kv, start):
        """Forward only, for generation: x (B, T, C) of the tokens at positions [start, start + T);
        ``kv`` = (k_cache, v_cache), each (B, NKV, T_max, HS), gains their rotated keys and their values.

        A key is rotated by its own position only, so the cached keys stay right as tokens are added.
        The cache holds the NKV K/V heads as they are, not repeated for the NH / NKV query heads that
        share each one: that is what grouped-query attention saves at inference - a cache NH / NKV times
        smaller, and as many times fewer bytes to read for every new token (decoding one token is
        mostly reading the cache)."""
        q, k, v, _, _, _ = self.rotated_heads(x, start=start)          # (B, NH, T, HS), (B, NKV, T, HS)
        o = attention_cached_forward(q, k, v, kv[0], kv[1], start, self.window)     # (B, NH, T, HS)
        return self.o_proj.forward(merge_heads(o))[0]                  # (B, T, C)

    def cache_shapes(self, batch, length):
        """The keys and values ``forward_cached`` keeps per layer: (B, NKV, length, HS) each."""
        nkv = self.qkv.parts[1].weight.data.shape[1] // self.head_size
        return ((batch, nkv, length, self.head_size),) * 2

    def backward(self, dy, cache, defer=None):
        (c_in, c_qk), c_core, c_o, cos, sin, nh = cache
        do = split_heads(self.o_proj.backward(dy, c_o, defer), nh)   # (B, nh, T, HS)
        dq, dk, dv = self.core.backward(do, c_core)                  # (B, nh, T, HS), (B, nkv, T, HS) twice
        dq = rope_backward(dq, cos, sin)
        dk = rope_backward(dk, cos, sin)
        if c_qk is not None:
            dq, dk = self.qk_norm.backward(dq, dk, c_qk, defer)
        return self.qkv.backward([merge_heads(d) for d in (dq, dk, dv)], c_in, defer)     # (B, T, C)
