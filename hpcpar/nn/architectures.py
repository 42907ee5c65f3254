"""What each family of blocks is made of - GPT-2, Llama, DeepSeek-V3 - and every trait the rest of the
package asks about one: the registry ``ARCHITECTURES``, chosen by ``GPTConfig.arch`` (nn/gpt.py).

The code branches on these traits, never on a family's name (tests/test_model_arithmetic.py), so a new
family of blocks is one more entry here (docs/architecture.md, "Where to add ...").
"""
from dataclasses import dataclass

from hpcpar.nn.block import LlamaBlock, TransformerBlock
from hpcpar.nn.experts import GeluExperts, SwiGLUExperts
from hpcpar.nn.layernorm import LayerNorm
from hpcpar.nn.mla import MLAttention
from hpcpar.nn.rmsnorm import RMSNorm
from hpcpar.nn.rotary_attention import RotaryAttention


@dataclass(frozen=True)
class TPCut:
    """How tensor parallelism cuts one module of a block (tensor_parallel/parallelize.py): the Linear
    (or Projections) attributes split by columns and by rows; ``groups`` column blocks (GPT-2's fused
    Q|K|V) are cut each on its own.  MLA enters the parallel region once, at ``entry`` (an attribute that
    becomes the input region), and then cuts ``inner`` Linears by columns with no communication."""
    module: str
    columns: tuple
    rows: tuple
    groups: int = 1
    inner: tuple = ()
    entry: str = ""


@dataclass(frozen=True)
class Parts:
    """What an architecture is made of, and every trait the rest of the package asks about a family:
    the code branches on these, never on the family's name.  The parameter names are Hugging Face's,
    so checkpoints map one to one."""
    title: str              # the family's name in a sentence
    block: type             # the transformer block
    norm: type              # the final normalisation (the blocks choose their own)
    norm_kind: str          # "layernorm" (weight and shift) or "rmsnorm" (weight): hpcpar/shape.py counts it
    tokens: str             # the token embedding's parameter name
    final_norm: str         # the final norm's name
    positions: str          # "learned": a position table added to the tokens; "rotary": in attention
    biases: bool            # the linear layers have biases
    gated: bool             # the MLP is gated (SwiGLU: gate, up, down) rather than two matrices and GELU
    grouped_kv: bool        # fewer key/value heads than query heads may be chosen (--kv-heads)
    dropout: bool           # the blocks have dropout (--dropout)
    own_head_only: bool     # the output projection is always a matrix of its own (never the tied embedding)
    hf_prefix: str          # the prefix of the blocks' and embedding's names in Hugging Face files
    tp: tuple               # the tensor-parallel plan of a block: TPCut of each module it cuts
    tp_replicated: tuple    # the block's norms, kept whole on every TP rank (sequence parallelism
                            # sums their gradients)
    tp_per_head: tuple      # the block's modules applied to each attention head on its own (QK-norm), named
                            # "attn.qk_norm": whole on every TP rank, which holds some of the heads, so their
                            # gradients are always partial sums over TP
    experts: type           # the experts of a mixture-of-experts block (nn/experts.py)
    hf_with_experts: str    # the Hugging Face family a model of this one with experts is ("": none; with
                            # QK-norm a Llama's is Qwen3-MoE, checkpoint/hf.py)
    tp_head_offset: bool = False  # the attention module needs its first head's index on this rank
    attention: type = None  # the attention module of a Llama-like block (``LlamaBlock``)
    latent: bool = False    # multi-head latent attention: q/k heads of head_dim, values of v_head_dim (MLA)
    routing_bias: bool = False    # a mixture of experts always holds the routing bias (its files do)

    @property
    def position_table(self):
        return self.positions == "learned"


ARCHITECTURES = {
    "gpt2": Parts("GPT-2", TransformerBlock, LayerNorm, "layernorm", "wte.weight", "ln_f", positions="learned",
                  biases=True, gated=False, grouped_kv=False, dropout=True, own_head_only=False,
                  hf_prefix="transformer.",
                  tp=(TPCut("attn", ("c_attn",), ("c_proj",), groups=3), TPCut("mlp", ("c_fc",), ("c_proj",))),
                  tp_replicated=("ln_1", "ln_2"), tp_per_head=(), experts=GeluExperts, hf_with_experts="",
                  tp_head_offset=True),
    "llama": Parts("Llama", LlamaBlock, RMSNorm, "rmsnorm", "embed_tokens.weight", "norm", positions="rotary",
                   biases=False, gated=True, grouped_kv=True, dropout=False, own_head_only=True, hf_prefix="model.",
                   tp=(TPCut("attn", ("qkv",), ("o_proj",)), TPCut("mlp", ("gate_up",), ("down_proj",))),
                   tp_replicated=("ln_1", "ln_2"), tp_per_head=("attn.qk_norm",), experts=SwiGLUExperts,
                   hf_with_experts="mixtral", attention=RotaryAttention),
    # DeepSeek-V3: a Llama block with multi-head latent attention (nn/mla.py); its down-projections and latent
    # norms whole on every TP rank, their gradients this rank's heads' share
    "deepseek_v3": Parts("DeepSeek-V3", LlamaBlock, RMSNorm, "rmsnorm", "embed_tokens.weight", "norm",
                         positions="rotary", biases=False, gated=True, grouped_kv=False, dropout=False,
                         own_head_only=True, hf_prefix="model.",
                         tp=(TPCut("attn", (), ("o_proj",), inner=("q_proj", "q_b_proj", "kv_b_proj"), entry="enter"),
                             TPCut("mlp", ("gate_up",), ("down_proj",))),
                         tp_replicated=("ln_1", "ln_2"), tp_per_head=("attn.down", "attn.q_a_layernorm",
                                                                      "attn.kv_a_layernorm"),
                         experts=SwiGLUExperts, hf_with_experts="deepseek_v3", attention=MLAttention, latent=True,
                         routing_bias=True),
}
