"""GPT-2 and Llama transformer blocks (pre-norm):

    x1 = x  + attn(ln_1(x))
    y  = x1 + mlp(ln_2(x1))

Backward runs the same lines in reverse; each residual sends the gradient both through its branch and
straight past it (ops/residual.py).  With ``recompute`` the forward keeps only its input, and the
backward runs the forward again to rebuild the cache: about a third more compute for a block's worth
of activations less memory per micro-batch in flight.

A Llama block is the same two lines with other parts: RMSNorm for LayerNorm, rotary grouped-query
attention, a SwiGLU MLP (``LlamaBlock``, which overrides only the constructor).  With ``cfg.n_expert``
either family's MLP is a mixture of experts of its own kind of MLP (nn/moe.py).
"""
from hpcpar.nn.attention import Attention
from hpcpar.nn.layernorm import LayerNorm
from hpcpar.nn.mlp import MLP
from hpcpar.nn.module import Module
from hpcpar.nn.moe import MoE
from hpcpar.nn.rmsnorm import RMSNorm
from hpcpar.nn.swiglu import SwiGLU
from hpcpar.ops.residual import residual_backward, residual_forward


class TransformerBlock(Module):
    def __init__(self, cfg, layer, seed, dtype):
        prefix = f"h.{layer}"
        self.layer = layer
        self.ln_1 = LayerNorm(f"{prefix}.ln_1", cfg.d_model, seed, dtype, cfg.ln_eps)
        self.attn = Attention(f"{prefix}.attn", cfg.d_model, cfg.n_head, cfg.n_layer, cfg.dropout, seed, dtype)
        self.attn.window = cfg.layer_window(layer)
        self.ln_2 = LayerNorm(f"{prefix}.ln_2", cfg.d_model, seed, dtype, cfg.ln_eps)
        self.mlp = MoE(f"{prefix}.mlp", cfg, seed, dtype) if cfg.moe_layer(layer) else \
            MLP(f"{prefix}.mlp", cfg.d_model, cfg.dense_ff, cfg.n_layer, cfg.dropout, seed, dtype)
        self.recompute = False

    def forward(self, x, ctx=None):
        if self.recompute:
            return self._forward(x, ctx)[0], ("recompute", x, ctx)
        return self._forward(x, ctx)

    def _forward(self, x, ctx):
        a, c_ln1 = self.ln_1.forward(x, ctx)
        a, c_attn = self.attn.forward(a, ctx)
        x1 = residual_forward(x, a, out=a)              # a, m, dm and da are this block's own
        m, c_ln2 = self.ln_2.forward(x1, ctx)           # temporaries: the sums go in place
        m, c_mlp = self.mlp.forward(m, ctx)
        return residual_forward(x1, m, out=m), (c_ln1, c_attn, c_ln2, c_mlp)

    def forward_cached(self, x, kv, start):
        """Forward only, for generation: the same two lines, attention through the KV cache ``kv``."""
        x1 = x + self.attn.forward_cached(self.ln_1.forward(x)[0], kv, start)
        return x1 + self.mlp.forward(self.ln_2.forward(x1)[0])[0]

    def backward(self, dy, cache, defer=None):
        if cache[0] == "recompute":
            _, x, ctx = cache
            cache = self._forward(x, ctx)[1]
        c_ln1, c_attn, c_ln2, c_mlp = cache
        dm = self.ln_2.backward(self.mlp.backward(dy, c_mlp, defer), c_ln2, defer)
        dx1 = residual_backward(dy, dm, out=dm)
        da = self.ln_1.backward(self.attn.backward(dx1, c_attn, defer), c_ln1, defer)
        return residual_backward(dx1, da, out=da)


class LlamaBlock(TransformerBlock):
    """x1 = x + attn(rmsnorm(x)),  y = x1 + swiglu_mlp(rmsnorm(x1)); Hugging Face's LlamaDecoderLayer names.
    The attention is the family's (``Parts.attention``): rotary grouped-query (Llama, Mixtral, Qwen3-MoE) or
    multi-head latent attention (DeepSeek-V3, nn/mla.py)."""

    def __init__(self, cfg, layer, seed, dtype):
        prefix = f"layers.{layer}"
        self.layer = layer
        self.ln_1 = RMSNorm(f"{prefix}.input_layernorm", cfg.d_model, seed, dtype, cfg.ln_eps)
        self.attn = cfg.parts.attention(f"{prefix}.self_attn", cfg, seed, dtype)
        self.attn.window = cfg.layer_window(layer)
        self.ln_2 = RMSNorm(f"{prefix}.post_attention_layernorm", cfg.d_model, seed, dtype, cfg.ln_eps)
        self.mlp = MoE(f"{prefix}.mlp", cfg, seed, dtype) if cfg.moe_layer(layer) else \
            SwiGLU(f"{prefix}.mlp", cfg.d_model, cfg.dense_ff, seed, dtype)
        self.recompute = False
