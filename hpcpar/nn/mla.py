"""DeepSeek-V3's multi-head latent attention (MLA; DeepSeek-V2 paper, section 2.1), with Hugging Face's names.

    x (B, T, C)
    q_lat  = rmsnorm(x W_qa)                 (B, T, rq)        q_a_proj, q_a_layernorm    (q_lora_rank rq > 0;
    q      = q_lat W_qb                      (B, T, NH*dq)     q_b_proj                    else q = x W_q: q_proj)
    [c | k_rope] = x W_kva                   (B, T, r + dr)    kv_a_proj_with_mqa
    c      = rmsnorm(c)                      (B, T, r)         kv_a_layernorm: the latent that generation caches
    kv     = c W_kvb                         (B, T, NH*(dn+dv)) kv_b_proj: per head [k_nope | v]
    heads  q_h = [q_nope | rope(q_rot)], k_h = [k_nope | rope(k_rope)] (one rotary key for all heads), v_h
    o      = attention(q_h, k_h, v_h)        the usual core (nn/attention_core.py; ring or Ulysses under CP)
    y      = concat_h(o_h) W_o               (B, T, C)         o_proj

dq = dn + dr (qk_nope_head_dim + qk_rope_head_dim, our ``head_size``), dv = v_head_dim; the rotary slice is
stored interleaved (``rope_interleave``) and its frequencies may be YaRN's (ops/yarn.py).  The heads'
assembly and its backward are ops/mla.py's; everything else is a Linear or an RMSNorm.

Tensor parallelism cuts the heads (``Parts.tp`` in nn/architectures.py): the up-projections q_b_proj (or q_proj) and
kv_b_proj by columns, o_proj by rows; the down-projections and the latent norms stay whole on every rank.
The region is entered once, on x (``enter``: f, or sequence parallelism's all-gather; its backward the
one all-reduce or reduce-scatter of dx), so every rank computes the same latents and then its own heads
with no communication in between; the whole parts' gradients are then this rank's heads' share, summed
over TP once a step (``Parts.tp_per_head``), like QK-norm's.  Serially ``enter`` is None.
"""
from hpcpar.backend import array_module
from hpcpar.nn.attention_core import LocalAttention, attention_mask
from hpcpar.nn.linear import Linear, Projections
from hpcpar.nn.module import Module
from hpcpar.nn.rmsnorm import RMSNorm
from hpcpar.nn.rotary_attention import token_positions
from hpcpar.ops.attention import merge_heads
from hpcpar.ops.mla import latent_cached_forward, mla_heads_backward, mla_heads_forward
from hpcpar.ops.rope import rope_tables
from hpcpar.runtime import UsageError

LATENT_EPS = 1e-6       # the latents' RMSNorms keep their default epsilon in DeepSeek's code and transformers'


class MLAttention(Module):
    def __init__(self, prefix, cfg, seed, dtype):
        C, NH, rq, r = cfg.d_model, cfg.n_head, cfg.q_lora_rank, cfg.kv_lora_rank
        dr, dv = cfg.qk_rope_dim, cfg.v_size
        dq = cfg.head_size
        self.dims, self.n_head = (dq - dr, dr, dv), NH
        self.theta, self.yarn, self.interleaved = cfg.rope_theta, cfg.yarn, cfg.rope_interleave
        self.scale = 1.0 if cfg.yarn is None else cfg.yarn.softmax_scale()

        def linear(name, d_in, d_out):
            return Linear(f"{prefix}.{name}", d_in, d_out, 0.02, seed, dtype, bias=False)
        self.enter = None                   # tensor parallelism: the input region (tensor_parallel/layers.py)
        self.q_proj = None if rq else linear("q_proj", C, NH * dq)
        self.q_a_layernorm = RMSNorm(f"{prefix}.q_a_layernorm", rq, seed, dtype, LATENT_EPS) if rq else None
        self.q_b_proj = linear("q_b_proj", rq, NH * dq) if rq else None
        self.down = Projections(*([linear("q_a_proj", C, rq)] if rq else []),
                                linear("kv_a_proj_with_mqa", C, r + dr))
        self.kv_a_layernorm = RMSNorm(f"{prefix}.kv_a_layernorm", r, seed, dtype, LATENT_EPS)
        self.kv_b_proj = linear("kv_b_proj", r, NH * (dq - dr + dv))
        self.o_proj = linear("o_proj", NH * dv, C)
        self.selective = False          # recompute the core's probabilities in backward (attention_core.py)
        self.core = LocalAttention()    # context parallelism swaps in its ring or Ulysses
        self.window = 0                 # no sliding window (check_latent refuses one): all the cache holds

    def heads_here(self):
        """The heads this rank holds (all of them, or its share under tensor parallelism)."""
        return self.kv_b_proj.weight.data.shape[-1] // (self.dims[0] + self.dims[2])

    def qk_scales(self, gamma, alpha=0.5):
        """QK-clip (training/qk_clip.py), as Kimi K2's MuonClip treats MLA: head h's query and key parts of
        its own (q_nope, k_nope) scaled by gamma^alpha and gamma^(1 - alpha), its rotary query by all of
        gamma, the rotary key that every head shares left alone.  [(parameter, a multiplier per column)]."""
        xp, (dn, dr, dv) = array_module(gamma), self.dims

        def per_head(*parts):               # [(exponent or None for 1, width)] -> a multiplier per column
            return xp.concatenate([xp.repeat(gamma ** e if e is not None else xp.ones_like(gamma), w).reshape(-1, w)
                                   for e, w in parts], axis=1).reshape(-1)
        q_cols = per_head((alpha, dn), (1, dr))                      # per head [q_nope | q_rope]
        kv_cols = per_head((1 - alpha, dn), (None, dv))              # per head [k_nope | v]
        proj = self.q_proj if self.q_b_proj is None else self.q_b_proj
        return [(proj.weight, q_cols), (self.kv_b_proj.weight, kv_cols)]

    def _queries_latent(self, x, ctx=None):
        """q (B, T, nh*dq), the normalised latent c (B, T, r), k_rope (B, T, dr) of x (B, T, C); the caches."""
        xf = x if self.enter is None else self.enter.forward(x)           # (B, T, C), whole on every rank
        down, c_down = self.down.forward(xf, ctx)
        r = self.kv_b_proj.weight.data.shape[0]
        if self.q_b_proj is None:
            q, c_q = self.q_proj.forward(xf, ctx)
            c_qn = None
        else:
            qn, c_qn = self.q_a_layernorm.forward(down[0], ctx)
            q, c_q = self.q_b_proj.forward(qn, ctx)
        c, c_cn = self.kv_a_layernorm.forward(down[-1][..., :r], ctx)
        return q, c, down[-1][..., r:], (c_down, c_qn, c_q, c_cn)

    def _tables(self, T, dtype, xp, ctx=None, start=0):
        cos, sin = rope_tables(start + token_positions(ctx, T), self.dims[1], self.theta, dtype, xp, self.yarn)
        return (cos[:, None], sin[:, None]) if cos.ndim == 3 else (cos, sin)   # per sequence: (B, 1, T, dr)

    def forward(self, x, ctx=None):
        q, c, k_rope, c_in = self._queries_latent(x, ctx)
        kv, c_kv = self.kv_b_proj.forward(c, ctx)                         # (B, T, nh*(dn+dv))
        nh = kv.shape[-1] // (self.dims[0] + self.dims[2])                # heads on this rank
        cos, sin = self._tables(q.shape[1], q.dtype, array_module(q), ctx)
        qh, kh, vh, c_heads = mla_heads_forward(q, kv, k_rope, nh, self.dims, cos, sin, self.interleaved, self.scale)
        o, c_core = self.core.forward(qh, kh, vh, lambda: None, self.selective, ctx,     # (B, nh, T, W)
                                      attn_mask=attention_mask(ctx))    # documents' masks (no window: below)
        y, c_o = self.o_proj.forward(merge_heads(o[..., :self.dims[2]]), ctx)           # (B, T, C)
        return y, (c_in, c_kv, c_heads, c_core, c_o, o.shape)

    def backward(self, dy, cache, defer=None):
        (c_down, c_qn, c_q, c_cn), c_kv, c_heads, c_core, c_o, o_shape = cache
        B, nh, T, W = o_shape
        xp = array_module(dy)
        do = xp.zeros(o_shape, dtype=dy.dtype)                              # the padding's gradient: none
        do[..., :self.dims[2]] = self.o_proj.backward(dy, c_o, defer).reshape(B, T, nh, -1).transpose(0, 2, 1, 3)
        dqh, dkh, dvh = self.core.backward(do, c_core)
        dq, dkv, dk_rope = mla_heads_backward(dqh, dkh, dvh, c_heads)
        dc = self.kv_a_layernorm.backward(self.kv_b_proj.backward(dkv, c_kv, defer), c_cn, defer)
        dkva = xp.concatenate([dc, dk_rope], axis=-1)                       # (B, T, r + dr)
        if self.q_b_proj is None:
            dx = self.q_proj.backward(dq, c_q, defer) + self.down.backward([dkva], c_down, defer)
        else:
            dqa = self.q_a_layernorm.backward(self.q_b_proj.backward(dq, c_q, defer), c_qn, defer)
            dx = self.down.backward([dqa, dkva], c_down, defer)
        return dx if self.enter is None else self.enter.backward(dx)        # TP: the sum over the heads' ranks

    def forward_cached(self, x, cache, start):
        """Forward only, for generation: x (B, T, C) of the tokens at positions [start, start + T);
        ``cache`` = (latent (B, T_max, r), rotary key (B, T_max, dr)) gains theirs - what MLA caches instead
        of every head's keys and values (ops/mla.py, ``latent_cached_forward``)."""
        q, c, k_rope, _ = self._queries_latent(x)
        cos, sin = self._tables(q.shape[1], q.dtype, array_module(q), start=start)
        o = latent_cached_forward(q, c, k_rope, cache, self.kv_b_proj.weight.data, self.dims, cos, sin,
                                  self.interleaved, self.scale, start)
        return self.o_proj.forward(o)[0]

    def cache_shapes(self, batch, length):
        """The two arrays ``forward_cached`` keeps per layer: the latent and the rotary key."""
        return (batch, length, self.kv_b_proj.weight.data.shape[0]), (batch, length, self.dims[1])


def check_latent(cfg):
    """Refuse latent-attention sizes on a model without MLA, and MLA sizes that cannot work (GPTConfig's check)."""
    given = cfg.q_lora_rank or cfg.kv_lora_rank or cfg.qk_rope_dim or cfg.v_head_dim or cfg.yarn is not None
    if not cfg.parts.latent:
        if given:
            raise UsageError(f"latent attention's sizes (q_lora_rank, kv_lora_rank, qk_rope_dim, v_head_dim, YaRN) "
                             f"need a DeepSeek model (--model deepseek-tiny), not {cfg.arch}")
        return
    if not (cfg.kv_lora_rank and cfg.qk_rope_dim and cfg.head_dim):
        raise UsageError("multi-head latent attention needs kv_lora_rank, qk_rope_dim and head_dim (the q/k head width)")
    if cfg.qk_rope_dim % 2 or cfg.qk_rope_dim >= cfg.head_dim:
        raise UsageError(f"qk_rope_dim {cfg.qk_rope_dim} must be even (rotary pairs) and less than the head's "
                         f"{cfg.head_dim} q/k features")
    if cfg.n_kv_head != cfg.n_head:
        raise UsageError("multi-head latent attention has a key and a value per head: no --kv-heads")
    if cfg.window:
        raise UsageError(f"--window {cfg.window}: hpcpar's latent attention has no sliding window (DeepSeek-V3 "
                         f"attends to every earlier key); --documents masks work")
