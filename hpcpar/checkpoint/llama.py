"""Llama weights as Hugging Face writes them (LlamaForCausalLM): names, layouts and config.json.

    model/
      model.safetensors   model.embed_tokens.weight (V, C), model.norm.weight (C,), lm_head.weight (V, C),
                          model.layers.N.{input_layernorm, post_attention_layernorm}.weight (C,),
                          model.layers.N.self_attn.{q,k,v,o}_proj.weight, model.layers.N.mlp.{gate,up,down}_proj.weight
      config.json         num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, rope_parameters, ...

Our parameters carry the same names without the ``model.`` prefix.  A torch Linear stores its weight
(out, in) and computes x W^T; ours store (in, out) and compute x W (ops/linear.py), so the seven
projection matrices of a layer are transposed on the way in and out (``transposed``); the rest is as is.
Only what hpcpar's Llama computes is accepted: SiLU, no biases, an untied head, plain RoPE.  ``head_dim``
is taken as the file says (Qwen3's 128 over hidden_size / heads = 64; absent: hidden_size / heads).
"""
import re

from hpcpar.checkpoint.gpt2 import Architecture, check_tensors, read_config_json, read_header, weights_file
from hpcpar.data.values import check_value
from hpcpar.nn.architectures import ARCHITECTURES
from hpcpar.runtime import UsageError

PREFIX = ARCHITECTURES["llama"].hf_prefix
# a torch Linear's weight: Llama's projections, and DeepSeek-V3's (checkpoint/deepseek_v3.py): the latent
# attention's, the shared experts', the MTP modules' eh_proj
_LINEAR = re.compile(r"\.(self_attn\.([qkvo]|q_[ab]|kv_b)_proj|self_attn\.kv_a_proj_with_mqa|"
                     r"mlp\.(shared_experts\.)?(gate|up|down)_proj|eh_proj)\.weight$")
_LAYER = re.compile(r"^layers\.(\d+)\.")


def transposed(name):
    """Is parameter ``name`` stored transposed in the file (a torch Linear weight)?"""
    return bool(_LINEAR.search(name))


def expected_shapes(mcfg):
    """{parameter name: full shape} of the whole Llama of config ``mcfg``, in our (in, out) layout."""
    C, F, V = mcfg.d_model, mcfg.d_ff, mcfg.vocab_size
    q, kv = mcfg.n_head * mcfg.head_size, mcfg.n_kv_head * mcfg.head_size
    shapes = {"embed_tokens.weight": (V, C), "norm.weight": (C,), "lm_head.weight": (V, C)}
    for i in range(mcfg.n_layer):
        for name, shape in (("input_layernorm.weight", (C,)), ("post_attention_layernorm.weight", (C,)),
                            ("self_attn.q_proj.weight", (C, q)), ("self_attn.k_proj.weight", (C, kv)),
                            ("self_attn.v_proj.weight", (C, kv)), ("self_attn.o_proj.weight", (q, C)),
                            ("mlp.gate_proj.weight", (C, F)), ("mlp.up_proj.weight", (C, F)),
                            ("mlp.down_proj.weight", (F, C))):
            shapes[f"layers.{i}.{name}"] = shape
        if mcfg.qk_norm:                      # Qwen3's QK-norm: a gain over a head's features for q, one for k
            shapes.update({f"layers.{i}.self_attn.{n}_norm.weight": (mcfg.head_size,) for n in "qk"})
    return shapes


# config.json entries hpcpar's Llama does not compute otherwise: (key, the values it accepts)
SUPPORTED = (("hidden_act", ("silu",)), ("attention_bias", (False,)), ("mlp_bias", (False,)),
              ("tie_word_embeddings", (False,)), ("pretraining_tp", (1,)), ("rope_scaling", (None,)))


def read_architecture(path, what="--init-from"):
    """The Architecture of the Llama at ``path``; ``what`` starts the error messages."""
    source, shapes, hf = read_shapes(path, what)
    return architecture(source, shapes, hf, what, shapes.get("layers.0.mlp.gate_proj.weight", (0, 0))[1],
                        expected_shapes)


def read_shapes(path, what, supported=SUPPORTED):
    """(weights file, {parameter name: shape in our layout}, config) of the file at ``path``, its config
    checked against ``supported``: (key, the values accepted)."""
    source = weights_file(path)
    found, meta = read_header(source, what)
    shapes = {k.removeprefix(PREFIX): (tuple(reversed(v)) if transposed(k) else v) for k, v in found.items()}
    hf = read_config_json(path, what) or meta
    for key, allowed in supported:
        if key in hf and hf[key] not in allowed:
            raise UsageError(f"{what}: {key} = {hf[key]!r} in its config is not supported (hpcpar's Llama "
                             f"has {allowed[0]!r})")
    return source, shapes, hf


def architecture(source, shapes, hf, what, d_ff, expected, **extra):
    """The Architecture of a Llama-like file from its shapes and config: ``d_ff`` its feed-forward width
    (as the shapes say; checked with the rest), ``expected`` (of a GPTConfig) the shapes to check against,
    ``extra`` are further GPTConfig and Architecture fields (the experts of a Mixtral)."""
    rope = hf.get("rope_parameters") or {}
    if "rope_theta" in rope:
        check_value(f"{what}: {source}'s config", "rope_parameters.rope_theta", rope["rope_theta"], "number")
    if rope.get("rope_type", "default") != "default":
        raise UsageError(f"{what}: rope_type {rope['rope_type']!r} is not supported (hpcpar's Llama has plain RoPE)")
    if "embed_tokens.weight" not in shapes or "layers.0.self_attn.k_proj.weight" not in shapes:
        raise UsageError(f"{what}: {source} is not a Llama (no embed_tokens.weight or layers.0.self_attn.k_proj)")
    n_head = int(hf.get("num_attention_heads", 0))
    if not n_head:
        raise UsageError(f"{what}: {source} does not say its number of attention heads (put its config.json "
                         f"beside it)")
    V, C = shapes["embed_tokens.weight"]
    HS = int(hf.get("head_dim") or C // n_head)              # transformers' default when the file has none
    wide = HS if HS != C // n_head else 0                     # GPTConfig's head_dim (0: C / NH)
    arch = dict(
        n_layer=max(int(m.group(1)) for m in map(_LAYER.match, shapes) if m) + 1, d_model=C,
        d_ff=d_ff, vocab_size=V,
        n_positions=int(hf.get("max_position_embeddings", 0)), tied=False, n_head=n_head, head_dim=wide,
        ln_eps=float(hf.get("rms_norm_eps", 0)), arch="llama",
        n_kv_head=shapes["layers.0.self_attn.k_proj.weight"][1] // HS,
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 0))))
    from hpcpar.nn.gpt import GPTConfig
    check_tensors(source, shapes, expected(GPTConfig(
        vocab_size=V, seq_len=1, n_layer=arch["n_layer"], n_head=n_head, n_kv_head=arch["n_kv_head"], d_model=C,
        head_dim=wide,
        d_ff=arch["d_ff"], arch="llama", tied=False, **extra)))
    return Architecture(**arch, **extra)


def sliding_window(hf, enabled=True):
    """The GPTConfig window fields of a config.json (or a lone file's metadata): its ``sliding_window``
    (when ``enabled``: Qwen's use_sliding_window), in the layers its ``layer_types`` mark
    "sliding_attention" (every layer when it has none: Mixtral, Qwen3-MoE, Mistral)."""
    window = hf.get("sliding_window")
    if not enabled or window in (None, "None"):
        return {}
    types = hf.get("layer_types")
    layers = ",".join(str(i) for i, kind in enumerate(types) if kind == "sliding_attention") if types else ""
    return {"window": int(window), "window_layers": layers}


def window_config(mcfg, family):
    """config.json's sliding_window of a model of ours (every layer windowed alike, or none); a window
    in some layers only is refused - ``family``'s file has no way to say it."""
    if mcfg.window and mcfg.window_layers:
        raise UsageError(f"a {family} file windows every layer or none: --window-layers {mcfg.window_layers} "
                         f"has no Hugging Face model to write (keep it as a checkpoint: --save)")
    return mcfg.window or None


def hf_config(mcfg):
    """The config.json of Hugging Face's LlamaForCausalLM for our Llama of config ``mcfg``."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "vocab_size": mcfg.vocab_size, "hidden_size": mcfg.d_model, "intermediate_size": mcfg.d_ff,
            "num_hidden_layers": mcfg.n_layer, "num_attention_heads": mcfg.n_head,
            "num_key_value_heads": mcfg.n_kv_head, "head_dim": mcfg.head_size,
            "max_position_embeddings": mcfg.n_positions, "rms_norm_eps": mcfg.ln_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": mcfg.rope_theta},
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
            "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def file_metadata(mcfg):
    """The architecture a lone file must record beyond its tensors' shapes (config.json's names)."""
    return {"model_type": "llama", "num_attention_heads": mcfg.n_head, "head_dim": mcfg.head_size,
            "rms_norm_eps": mcfg.ln_eps, "rope_theta": mcfg.rope_theta, "max_position_embeddings": mcfg.n_positions}
