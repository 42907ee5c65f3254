"""A model's shape: the numbers that decide its parameters, FLOPs and memory - one arithmetic for the
engine (nn/gpt.py's counts, pipeline/partition.py's cuts, flops.py) and the planner (hpcpar/tools/plan).

The engine builds its shape from the architecture registry (``GPTConfig.shape``, nn/architectures.py's
``ARCHITECTURES``); the planner reads one from a TOML file or a dims string (tools/plan/models.py).  Either
way the same methods count.  Parameters of a pre-norm transformer block (h hidden, a heads of size
d = h/a unless given (Qwen3: 128 whatever h/a), kv key/value heads, f the MLP width)::

    attention  h*(a*d + 2*kv*d)  Q, K, V  +  a*d*h  output      (kv = a without grouped-query attention)
    MLP        2*h*f, or 3*h*f for a gated MLP (SwiGLU: gate, up, down)
    experts    instead of one MLP: the router h*E, E MLPs, the shared experts (one MLP S*f wide), the
               balancing bias E; a token's FLOPs go through the router and k + S MLPs (active, not total)
    biases     (a*d + 2*kv*d) + h + f (2f gated) + h             (GPT-2; Llama has none)
    norms      two per block: 2h each for LayerNorm (weight and shift), h for RMSNorm (weight); with
               QK-norm (Qwen3) two gains of d more, one for the queries' heads and one for the keys'

so a GPT-2 block holds 12h^2 + 13h parameters, and the whole model
P = 12*l*h^2 * (1 + 13/(12h) + (V + s)/(12*l*h)) with tied embeddings and learned positions.

Multi-head latent attention (DeepSeek-V3, nn/mla.py; kv_lora_rank r > 0), d = dn + dr the q/k head width,
dr its rotary part, dv the value width, rq the queries' latent (0: none)::

    queries    h*rq + rq + rq*a*d    (q_a_proj, its norm, q_b_proj)   or  h*a*d  (q_proj)
    keys/vals  h*(r + dr) + r + r*a*(dn + dv)    (kv_a_proj_with_mqa, its norm, kv_b_proj)
    output     a*dv*h

The first ``dense_layers`` blocks of a mixture of experts keep a dense MLP ``dense_ffn`` wide (DeepSeek-V3:
3 of 61, 18432 wide; its experts 2048).  ``mtp`` multi-token-prediction modules (nn/mtp.py) each add a
block with experts, two norms of h, the 2h -> h projection and a final norm of h; their embedding and head
are the model's, so ``params`` (the published count) leaves them out and ``mtp_params`` counts them.

Forward FLOPs per token of one block (Narayanan et al. 2021, eq. 3, generalised): 2 per weight of its
GEMMs, 2 * (h*(a*d + 2*kv*d) + a*d*h + (2 or 3)*h*f), plus 2*s*a*(d + dv) for the attention core (QK^T
and PV over all a heads after the K/V repeat; 4*s*a*d when dv = d); the head 2*h*V.  A training step is 3
forwards.  A KV cache holds per token and layer 2*kv*d numbers, MLA's its latent and rotary key, r + dr.

The s of the attention core is the keys a token is charged with: the whole s x s square of scores,
as Narayanan et al. count it.  A packed window of documents (--documents) attends within each only,
and a sliding window of W keys cuts each document's triangle to a band: ``attention_span`` charges each
document its own square (twice its triangle less the diagonal: the same convention), summed over the
window's documents - sum L_d^2 / T without a window, s itself for one document.
"""
from dataclasses import dataclass, field

from hpcpar.runtime import UsageError

NORM_VECTORS = {"layernorm": 2, "rmsnorm": 1}      # parameter vectors of h per normalisation


def visible_pairs(length, window=0):
    """The (query, key) pairs one document of ``length`` tokens attends: the causal triangle
    L (L + 1) / 2, or, each query seeing at most W keys, W (W + 1) / 2 + (L - W) W."""
    if not window or window >= length:
        return length * (length + 1) // 2
    return window * (window + 1) // 2 + (length - window) * window


def attention_span(lengths, window=0):
    """The keys per token the FLOP count charges the attention core with, for a window holding
    documents of ``lengths`` tokens: each document's square (2 pairs - L), summed, over the tokens."""
    return sum(2 * visible_pairs(n, window) - n for n in lengths) / sum(lengths)


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    kv_heads: int = 0            # 0: as many as heads (no grouped-query attention)
    head_dim: int = 0            # 0: hidden / heads
    ffn: int = 0                 # 0: 4 * hidden
    gated: bool = False          # SwiGLU-style MLP: three matrices instead of two
    tied: bool = True            # the LM head reuses the token embedding
    positions: str = "learned"   # "learned" (a table of positions x h) or "rotary"/"alibi" (none)
    biases: bool = True          # GPT has biases; Llama-style models do not
    norm: str = ""               # "layernorm" or "rmsnorm"; "": LayerNorm with biases, RMSNorm without
    dropout: bool = False        # dropout stores a 1-byte mask per element it touches
    experts: int = 0             # routed experts per block (a mixture of experts), each an MLP of width ffn
    top_k: int = 0               # routed experts a token goes through
    shared_experts: int = 0      # experts every token goes through: one MLP shared_experts * ffn wide
    expert_bias: bool = False    # the auxiliary-loss-free balancing bias (one number per expert)
    qk_norm: bool = False        # RMSNorm over each head's queries and keys: two gains of head_dim (Qwen3)
    q_lora_rank: int = 0         # MLA: the queries' latent (0: queries straight from the hidden state)
    kv_lora_rank: int = 0        # MLA: the keys' and values' latent (0: no MLA)
    qk_rope_dim: int = 0         # MLA: the rotary part of head_dim
    v_head_dim: int = 0          # MLA: a value head's width (0: head_dim)
    dense_layers: int = 0        # the first blocks of a mixture of experts that keep a dense MLP
    dense_ffn: int = 0           # ... its width (0: ffn)
    mtp: int = 0                 # multi-token-prediction modules (each a block with experts, and more)
    source: str = ""
    _layer: int = field(init=False, repr=False, compare=False, default=0)   # layer_params, counted once

    def __post_init__(self):
        for f in ("layers", "hidden", "heads"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise UsageError(f"model {self.name}: {f} must be a positive integer")
        if not isinstance(self.vocab, int) or self.vocab < 0:
            raise UsageError(f"model {self.name}: vocab must be a non-negative integer (0: from the data)")
        if not self.head_dim and self.hidden % self.heads:
            raise UsageError(f"model {self.name}: hidden {self.hidden} is not divisible by heads {self.heads}")
        object.__setattr__(self, "kv_heads", self.kv_heads or self.heads)
        object.__setattr__(self, "head_dim", self.head_dim or self.hidden // self.heads)
        object.__setattr__(self, "ffn", self.ffn or 4 * self.hidden)
        object.__setattr__(self, "dense_ffn", self.dense_ffn or self.ffn)
        object.__setattr__(self, "v_head_dim", self.v_head_dim or self.head_dim)
        if self.kv_lora_rank and not 0 < self.qk_rope_dim < self.head_dim:
            raise UsageError(f"model {self.name}: qk_rope_dim {self.qk_rope_dim} must be part of head_dim {self.head_dim}")
        object.__setattr__(self, "norm", self.norm or ("layernorm" if self.biases else "rmsnorm"))
        if self.heads % self.kv_heads:
            raise UsageError(f"model {self.name}: heads {self.heads} not divisible by kv_heads {self.kv_heads}")
        if self.norm not in NORM_VECTORS:
            raise UsageError(f"model {self.name}: norm {self.norm!r} (use {' or '.join(NORM_VECTORS)})")
        object.__setattr__(self, "_layer", self._count_layer())

    @property
    def attention_width(self):
        """The a heads of d side by side: the queries' width, the attention output's (h when d = h/a)."""
        return self.heads * self.head_dim

    @property
    def qkv_width(self):
        """Output width of the Q, K, V projections together: a*d for queries, kv*d each for keys and values
        (MLA: the heads' q, k and v as its up-projections give them, a*(2d + dv))."""
        if self.kv_lora_rank:
            return self.heads * (2 * self.head_dim + self.v_head_dim)
        return self.attention_width + 2 * self.kv_heads * self.head_dim

    @property
    def mlp_matrices(self):
        return 3 if self.gated else 2

    # --- parameters ----------------------------------------------------------------------------

    def norm_params(self):
        """One normalisation: LayerNorm's weight and shift, or RMSNorm's weight."""
        return NORM_VECTORS[self.norm] * self.hidden

    def layer_params(self, layer=None):
        """Parameters of transformer block ``layer`` (None: one with the model's MLP or mixture of experts)."""
        if layer is not None and layer < self.dense_layers:
            return self._layer - self.feed_forward_params() + self.mlp_params(self.dense_ffn)
        return self._layer

    def attention_params(self):
        """One block's attention (module docstring)."""
        h, a, d = self.hidden, self.heads, self.head_dim
        if self.kv_lora_rank:
            rq, r, dr, dv = self.q_lora_rank, self.kv_lora_rank, self.qk_rope_dim, self.v_head_dim
            q = h * rq + rq + rq * a * d if rq else h * a * d
            return q + h * (r + dr) + r + r * a * (d - dr + dv) + a * dv * h
        return h * self.qkv_width + self.attention_width * h + (self.qkv_width + h if self.biases else 0)

    def _count_layer(self):
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        return self.attention_params() + qk_norm + self.feed_forward_params() + 2 * self.norm_params()

    def mtp_params(self):
        """The multi-token-prediction modules: each a block with experts, two norms of h, the 2h -> h
        projection and its final norm (their embedding and head are the model's)."""
        return self.mtp * (self._layer + 3 * self.norm_params() + 2 * self.hidden * self.hidden)

    def kv_cache_per_token(self):
        """Numbers a KV cache holds per token over all layers: 2*kv*d each (MLA: the latent and the rotary key)."""
        per_layer = self.kv_lora_rank + self.qk_rope_dim if self.kv_lora_rank else 2 * self.kv_heads * self.head_dim
        return self.layers * per_layer

    def heads_kv_per_token(self):
        """... and what a cache of every head's own key and value would hold: a*(d + dv) a layer (plain
        multi-head attention; grouped-query attention keeps kv/a of it, MLA its latent instead)."""
        return self.layers * self.heads * (self.head_dim + self.v_head_dim)

    def mlp_params(self, width=None):
        """One MLP of ``width`` (default ffn): its matrices, and with biases one per column-side output
        (f each) and the output's h."""
        h, f = self.hidden, width or self.ffn
        return self.mlp_matrices * h * f + ((self.mlp_matrices - 1) * f + h if self.biases else 0)

    def feed_forward_params(self):
        """The block's MLP, or its mixture of experts (module docstring)."""
        if not self.experts:
            return self.mlp_params()
        shared = self.mlp_params(self.shared_experts * self.ffn) if self.shared_experts else 0
        return self.hidden * self.experts + self.experts * self.mlp_params() + shared \
            + (self.experts if self.expert_bias else 0)

    def quantised_params(self):
        """The matrices of one block an FP8/FP4 recipe quantises (hpcpar/fp8): Q, K, V and the output
        projection, and the MLP's unless a mixture of experts replaces it (those stay in high precision)."""
        h = self.hidden
        return h * self.qkv_width + self.attention_width * h + (0 if self.experts else self.mlp_matrices * h * self.ffn)

    def routed_params(self):
        """A block's routed experts: E MLPs (0 without experts) - what expert parallelism cuts over ep."""
        return self.experts * self.mlp_params()

    def moe_whole_params(self):
        """What every tensor-parallel rank holds whole of a mixture of experts: the router, the shared
        experts and the balancing bias (the MoE layer is not cut over TP); 0 without experts."""
        return self.feed_forward_params() - self.routed_params() if self.experts else 0

    def gathered_block_params(self, tp, ep, shard):
        """One block as a ZeRO-3 rank gathers it (its unit): the part cut over TP / tp, the MoE layer's
        whole part (less the routing bias, never gathered), and its E/ep routed experts - unless their
        group (shard / ep of the ``shard`` ranks holding the same weights) is one rank, where they stay
        resident and are never gathered."""
        dense, routed = self.block_split(tp, ep)
        return dense - self.routing_bias_params() + (routed if shard > ep else 0)

    def block_split(self, tp, ep):
        """(dense, routed) numbers of one block on a rank: the part cut over TP / tp plus the MoE layer's
        whole part (router, shared experts, bias: not cut over TP), and its E/ep routed experts (whole
        over TP).  A block without experts: (layer / tp, 0)."""
        routed, whole = self.routed_params(), self.moe_whole_params()
        return (self.layer_params() - routed - whole) / tp + whole, routed / ep

    def routing_bias_params(self):
        """The auxiliary-loss-free balancing bias of a block (E numbers, or 0): moved after each step
        from the expert counts, never by a gradient, so every rank keeps it whole, under ZeRO-3 too."""
        return self.experts if self.expert_bias else 0

    def active_params(self, positions):
        """Parameters a token's forward multiplies or reads: the routed experts it goes through (top_k
        of E), not all E; equal to ``params`` without experts."""
        moe_layers = self.layers - self.dense_layers
        return self.params(positions) - moe_layers * (self.experts - self.top_k) * self.mlp_params() \
            if self.experts else self.params(positions)

    def token_params(self):
        """The (V, h) token embedding, and an output projection of its own."""
        return self.vocab * self.hidden

    def position_params(self, positions):
        """A learned table of ``positions`` rows (none for rotary or ALiBi positions)."""
        return positions * self.hidden if self.positions == "learned" else 0

    def embedding_params(self, positions):
        return self.token_params() + self.position_params(positions)

    def head_params(self, own_weight=None):
        """Final norm, plus the output projection when it is not the token embedding (default: untied)."""
        own = not self.tied if own_weight is None else own_weight
        return self.norm_params() + (self.token_params() if own else 0)

    def params(self, positions):
        """The model's parameters (its MTP modules apart: ``mtp_params``)."""
        blocks = self.layers * self._layer + self.dense_layers * (self.layer_params(0) - self._layer)
        return blocks + self.embedding_params(positions) + self.head_params()

    def stage_params(self, blocks, first, last, positions, own_head, tp=1):
        """Parameters on one rank of a pipeline stage of ``blocks`` blocks that holds the embedding
        (``first``) and/or the head (``last``; ``own_head``: its projection is a matrix of its own, or a
        copy of the tied embedding on another stage).  Over tp ranks the blocks and the vocabulary are
        cut; position table and final norm are whole on every rank.  The first stage holds the dense blocks
        of a mixture of experts (the pipeline's first layers); the last the MTP modules, with a copy of the
        token embedding unless it is the first too."""
        count = blocks * self.layer_params() / tp
        if first:
            count += self.token_params() / tp + self.position_params(positions)
            count += min(blocks, self.dense_layers) * (self.layer_params(0) - self.layer_params()) / tp
        if last:
            count += self.norm_params() + (self.token_params() / tp if own_head else 0)
            count += self.mtp_params() / tp + (self.token_params() / tp if self.mtp and not first else 0)
        return count

    # --- FLOPs ---------------------------------------------------------------------------------

    def block_forward_flops(self, span, layer=None):
        """Forward FLOPs of block ``layer`` per token (module docstring; None: one with the model's MLP or
        experts, a dense first block of a mixture of experts otherwise); ``span`` the keys a token is
        charged with: the sequence length, or a packed window's ``attention_span``."""
        h, f = self.hidden, self.ffn
        mlp = self.mlp_matrices * h * f
        if layer is not None and layer < self.dense_layers:
            mlp = self.mlp_matrices * h * self.dense_ffn
        elif self.experts:                  # the router, and the MLPs a token goes through
            mlp = h * self.experts + (self.top_k + self.shared_experts) * mlp
        # its GEMMs' weights: the attention's less its biases and MLA's latent norms
        weights = self.attention_params() - (self.qkv_width + h if self.biases else 0) \
            - self.q_lora_rank - self.kv_lora_rank
        return 2 * (weights + mlp) + 2 * span * self.heads * (self.head_dim + self.v_head_dim)

    def head_forward_flops(self):
        """Forward FLOPs of the output projection per token."""
        return 2 * self.hidden * self.vocab

    def mtp_forward_flops(self, span):
        """Forward FLOPs of the MTP modules per token: each a block, its 2h -> h projection and the head."""
        return self.mtp * (self.block_forward_flops(span) + 4 * self.hidden ** 2 + self.head_forward_flops())

    def forward_flops(self, span):
        """Forward FLOPs per token of the whole model, its MTP modules included."""
        blocks = sum(self.block_forward_flops(span, i) for i in range(self.dense_layers)) \
            + (self.layers - self.dense_layers) * self.block_forward_flops(span)
        return blocks + self.head_forward_flops() + self.mtp_forward_flops(span)
