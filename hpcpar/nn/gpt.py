"""GPT: token and position embedding, a stack of transformer blocks, final norm, LM head (nn/head.py), loss.

A ``GPT`` object is one *pipeline stage*: it holds a contiguous run of blocks, plus the embedding if it is
the first stage and the head (with the MTP modules, nn/mtp.py) if it is the last.  The single-rank model
is the stage that holds everything, so the reference and every parallel layout run the very same code.

    forward(ids (B, T) or hidden (B, T, C), ctx, targets (B, T) if last) -> loss sum | hidden (B, T, C)
    backward(dloss scale | dhidden, cache) -> dhidden (B, T, C) | None on the first stage

The loss is the *sum* of per-token cross-entropies; the caller's dloss = 1 / (tokens in the global
batch) turns the sum over micro-batches and data-parallel ranks into exactly the single-rank mean.
With documents, the targets that cross into the next document (``ctx.keep`` False) add nothing, and
the tokens counted are the targets kept.

The architecture is chosen once: ``GPTConfig.arch`` names an entry of ``ARCHITECTURES``
(nn/architectures.py) - which block, which normalisation, positions, biases, gated MLP, K/V heads, head,
Hugging Face names and the tensor-parallel plan of a block. GPT-2 ("gpt2", the default) and Llama
("llama": RMSNorm, rotary grouped-query attention, SwiGLU, untied head, no biases, docs/llama.md; Qwen3's
QK-norm an option) and DeepSeek-V3 ("deepseek_v3": a Llama block with latent attention, docs/deepseek.md)
share everything else; no code outside the registry asks which family it runs. Its counts (parameters,
FLOPs) are its shape's (``GPTConfig.shape``, hpcpar/shape.py), the arithmetic the planner uses too.
"""
from dataclasses import dataclass, replace

from hpcpar.nn.architectures import ARCHITECTURES
from hpcpar.nn.embedding import Embedding, embedding_copy
from hpcpar.nn.head import LMHead
from hpcpar.nn.mla import check_latent
from hpcpar.nn.moe import check_groups
from hpcpar.nn.mtp import MTP
from hpcpar.nn.parameter import Parameter, init_full
from hpcpar.nn.stage import Stage
from hpcpar.ops.masks import windowed_layers
from hpcpar.runtime import UsageError
from hpcpar.shape import ModelShape


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64
    seq_len: int = 64            # the training sequence length
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    d_ff: int = 0                # 0 means 4 * d_model
    dropout: float = 0.0
    tied: bool = True            # output projection shares the token embedding (GPT-2)
    ln_eps: float = 1e-5
    positions: int = 0           # rows of the position embedding (0: seq_len); Llama: the longest sequence
    arch: str = "gpt2"           # an entry of ARCHITECTURES
    n_kv_head: int = 0           # key/value heads of grouped-query attention (0: n_head); Llama only
    head_dim: int = 0            # features per head (0: d_model // n_head; Qwen3's are wider); Llama only
    rope_theta: float = 10000.0  # base of the rotary frequencies; Llama only
    qk_norm: bool = False        # RMSNorm over each head's q and k before RoPE (Qwen3, ops/qk_norm.py); Llama only
    window: int = 0              # sliding-window attention: a query sees at most this many keys (0: all)
    window_layers: str = ""      # ... in these layers: "" all, a slice "::2" or a list "0,2" (ops/masks.py)
    # mixture of experts (nn/moe.py, docs/moe.md); n_expert 0: the dense MLP
    n_expert: int = 0            # routed experts per layer, each an MLP of width d_ff
    top_k: int = 2               # experts per token
    n_shared_expert: int = 0     # experts every token goes through (one dense MLP n_shared_expert d_ff wide)
    router_score: str = "softmax"    # or "sigmoid" (DeepSeek-V3)
    norm_topk: bool = True       # the k chosen scores renormalised to sum to 1
    aux_loss_coef: float = 0.0   # load-balancing loss coefficient (Switch/Mixtral form)
    capacity_factor: float = 0.0     # 0: dropless; else an expert takes ceil(cf N k / E) rows at most
    bias_rate: float = 0.0       # DeepSeek-V3's auxiliary-loss-free balancing: the bias's step per step
    first_dense: int = 0         # the first layers keep a dense MLP, d_ff_dense wide (first_k_dense_replace)
    d_ff_dense: int = 0          # ... their width (0: d_ff; with experts d_ff is an expert's)
    n_group: int = 1             # group-limited routing (ops/router.py): the experts in n_group groups, a
    topk_group: int = 1          # token's experts from its topk_group best groups (DeepSeek-V3: 8 and 4)
    routed_scale: float = 1.0    # the routed experts' combine weights times this (routed_scaling_factor)
    # DeepSeek-V3's multi-head latent attention (arch "deepseek_v3", nn/mla.py); head_dim is its q/k head width
    q_lora_rank: int = 0         # the queries' latent (0: queries straight from x)
    kv_lora_rank: int = 0        # the keys' and values' shared latent: what generation caches
    qk_rope_dim: int = 0         # a head's rotary q/k features (the key's rotary slice is shared by all heads)
    v_head_dim: int = 0          # a head's value width (0: head_size)
    rope_interleave: bool = True     # the rotary features stored as interleaved pairs (DeepSeek's files)
    yarn: object = None          # ops/yarn.Yarn: rotary frequencies stretched for a longer context (None: plain)
    # multi-token prediction (nn/mtp.py, docs/deepseek.md)
    mtp_depth: int = 0           # D extra modules, module k predicting the token k + 1 after the next
    mtp_lambda: float = 0.3      # the weight of the mean of their losses

    def __post_init__(self):
        if not self.d_ff:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        if not self.n_kv_head:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if self.head_dim % 2:
            raise UsageError(f"head_dim {self.head_dim} is odd: rotary positions turn pairs of a head's features")
        p = self.parts
        if (self.head_dim and not (p.grouped_kv or p.latent)) or (self.qk_norm and not p.grouped_kv):
            what = "--head-dim" if self.head_dim else "QK-norm"     # GPT-2's attention has neither, MLA no QK-norm
            raise UsageError(f"{what} needs a Llama model (--model llama-tiny or llama-small), not {self.arch}")
        check_latent(self)
        check_groups(self)

    @property
    def parts(self):
        return ARCHITECTURES[self.arch]

    def layer_window(self, layer):
        """The sliding window of block ``layer`` (0: it attends to every earlier key of its document)."""
        return self.window if self.window and layer in windowed_layers(self.window_layers, self.n_layer) else 0

    @property
    def v_size(self):
        """A head's value width: v_head_dim (MLA), else the head size."""
        return self.v_head_dim or self.head_size

    @property
    def dense_ff(self):
        """The width of a dense MLP: d_ff_dense where given, else d_ff."""
        return self.d_ff_dense or self.d_ff

    @property
    def routing_bias(self):
        """A mixture of experts holds DeepSeek-V3's routing bias: moved by --bias-rate, or its family's always."""
        return bool(self.n_expert and (self.bias_rate or self.parts.routing_bias))

    def moe_layer(self, layer):
        """Is layer ``layer`` (an MTP module's: n_layer ..) a mixture of experts? Not the first ``first_dense``."""
        return bool(self.n_expert) and layer >= self.first_dense

    @property
    def head_size(self):
        """HS, the features of one head: head_dim when given, else d_model / n_head (kept 0 in the field, so
        that a config ``replace``d with another width or head count follows it)."""
        return self.head_dim or self.d_model // self.n_head

    @property
    def n_positions(self):
        """The longest sequence the model can read: GPT-2's block size, >= the training seq_len."""
        return self.positions or self.seq_len

    @property
    def shape(self):
        """The model's shape (hpcpar/shape.py): its parameter, FLOP and memory arithmetic, which the
        planner shares.  The traits come from the architecture registry, the sizes from here."""
        p = self.parts
        return ModelShape(self.arch, self.n_layer, self.d_model, self.n_head, self.vocab_size,
                          kv_heads=self.n_kv_head if p.grouped_kv else self.n_head,   # GPT-2: full K/V heads
                          head_dim=self.head_size,
                          ffn=self.d_ff, gated=p.gated, tied=self.tied,
                          positions=p.positions, biases=p.biases, norm=p.norm_kind, dropout=self.dropout > 0,
                          experts=self.n_expert, top_k=self.top_k if self.n_expert else 0,
                          shared_experts=self.n_shared_expert, expert_bias=self.routing_bias,
                          qk_norm=self.qk_norm, q_lora_rank=self.q_lora_rank, kv_lora_rank=self.kv_lora_rank,
                          qk_rope_dim=self.qk_rope_dim, v_head_dim=self.v_head_dim,
                          dense_layers=min(self.first_dense, self.n_layer) if self.n_expert else 0,
                          dense_ffn=self.dense_ff, mtp=self.mtp_depth)

    # --- parameter counts: the model's, and a pipeline stage's parts (pipeline/partition.py) -----

    def embedding_params(self):
        """Token (V, C) and position (n_positions, C) embeddings (Llama: no position table)."""
        return self.shape.embedding_params(self.n_positions)

    def block_params(self, layer=None):
        """Parameters of block ``layer`` (None: a block with the model's MLP or mixture of experts)."""
        return self.shape.layer_params(layer)

    def head_params(self, own_weight):
        """Final norm, and the (V, C) output projection when it is not the token embedding's."""
        return self.shape.head_params(own_weight)

    def n_params(self):
        """The whole model's, its MTP modules included (their embedding and head are the model's)."""
        return self.embedding_params() + sum(self.block_params(i) for i in range(self.n_layer)) \
            + self.head_params(not self.tied) + self.shape.mtp_params()


def preset(name, **overrides):
    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})


class GPT(Stage):
    def __init__(self, cfg, seed=0, dtype="float32", layers=None, first=True, last=True):
        from hpcpar.backend import resolve_dtype
        dtype = resolve_dtype(dtype)
        self.cfg = cfg
        layers = range(cfg.n_layer) if layers is None else layers
        self.embed = Embedding(cfg, seed, dtype) if first else None
        self.blocks = [cfg.parts.block(cfg, i, seed, dtype) for i in layers]
        self.head = None
        if last:
            # the last stage of a pipeline holds its own copy of a tied embedding (the head's weight, and
            # the MTP modules' lookup); the two copies start equal and stay equal because their gradients
            # are summed every step (training/gradient_sums.py)
            copy = None if first or not (cfg.tied or cfg.mtp_depth) else embedding_copy(cfg, seed, dtype)
            wte = self.embed.wte if first else copy
            if not cfg.tied:
                weight = Parameter("lm_head.weight", init_full("lm_head.weight", (cfg.vocab_size, cfg.d_model),
                                                               0.02, seed, dtype))
            else:
                weight = wte                                       # the same object: one gradient
            self.head = LMHead(cfg, weight, seed, dtype, MTP(cfg, wte, seed, dtype) if cfg.mtp_depth else None)
        self.mark_matrices()

    def tie_to(self, wte):
        """One rank holds both ends (pp = 1 interleaved, a V): the head (tied) and the MTP modules use the
        first stage's embedding ``wte`` itself."""
        if self.cfg.tied:
            self.head.weight = wte
        if self.head.mtp is not None:
            self.head.mtp.embed.wte = wte


# Presets: dims only; the vocabulary comes from the data unless the preset fixes it (gpt2).
PRESETS = {
    "tiny": GPTConfig(vocab_size=0, seq_len=64, n_layer=2, n_head=4, d_model=64),
    "small": GPTConfig(vocab_size=0, seq_len=128, n_layer=4, n_head=8, d_model=256),
    "gpt2": GPTConfig(vocab_size=50257, seq_len=1024, n_layer=12, n_head=12, d_model=768),
    "llama-tiny": GPTConfig(vocab_size=0, seq_len=64, n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=176,
                            arch="llama", tied=False, ln_eps=1e-6),
    "llama-small": GPTConfig(vocab_size=0, seq_len=128, n_layer=4, n_head=8, n_kv_head=4, d_model=256, d_ff=688,
                             arch="llama", tied=False, ln_eps=1e-6),
    "moe-tiny": GPTConfig(vocab_size=0, seq_len=64, n_layer=2, n_head=4, d_model=64, d_ff=128,
                          n_expert=4, top_k=2),
    "mixtral-tiny": GPTConfig(vocab_size=0, seq_len=64, n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=88,
                              arch="llama", tied=False, ln_eps=1e-6, n_expert=4, top_k=2),
    "qwen3-moe-tiny": GPTConfig(vocab_size=0, seq_len=64, n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=88,
                                arch="llama", tied=False, ln_eps=1e-6, n_expert=4, top_k=2, qk_norm=True),
    # DeepSeek-V3 in small (docs/deepseek.md): a dense first layer, then experts in 2 groups with a shared one;
    # MLA with latents of 24 and 16, heads of 12 + 4 rotary features, values of 10
    "deepseek-tiny": GPTConfig(vocab_size=0, seq_len=64, n_layer=3, n_head=4, d_model=64, d_ff=32, d_ff_dense=96,
                               arch="deepseek_v3", tied=False, ln_eps=1e-6, n_expert=4, top_k=2, n_shared_expert=1,
                               router_score="sigmoid", first_dense=1, n_group=2, topk_group=1, routed_scale=2.5,
                               q_lora_rank=24, kv_lora_rank=16, head_dim=16, qk_rope_dim=4, v_head_dim=10),
}
