"""GPT-2 weights as Hugging Face writes them: where they are, what architecture they hold, and the
``config.json`` that goes with them.

    model/                     a ``save_pretrained`` directory (or a lone .safetensors file)
      model.safetensors        transformer.wte.weight (V, C), transformer.wpe.weight (P, C), h.N.* ...
      config.json              n_head, layer_norm_epsilon, activation_function, tie_word_embeddings, ...

The shapes of the tensors give the layers, the width, the feed-forward width, the vocabulary and the
position table; config.json (or, in a file hpcpar wrote, the file's own metadata) gives the rest.
Only the file's header is read here, so every rank can check a run against the file before any rank
communicates, and a file that does not hold exactly the tensors of its model is refused whole.
"""
import re
from dataclasses import dataclass
from pathlib import Path

from hpcpar.data.values import read_optional_json
from hpcpar.nn.architectures import ARCHITECTURES
from hpcpar.runtime import UsageError

WEIGHTS, CONFIG = "model.safetensors", "config.json"
PREFIX = ARCHITECTURES["gpt2"].hf_prefix
_BUFFER = re.compile(r"^h\.\d+\.attn\.(masked_)?bias$")      # attention-mask buffers, not parameters
_LAYER = re.compile(r"^h\.(\d+)\.")


def parameter_name(key):
    """A file's tensor name -> our parameter name, or None for a non-parameter buffer."""
    key = key.removeprefix(PREFIX)
    return None if _BUFFER.match(key) else key


def weights_file(path):
    """The safetensors file of ``path``: the file itself, or a directory's model.safetensors."""
    path = Path(path)
    return path / WEIGHTS if path.is_dir() else path


def expected_shapes(mcfg):
    """{parameter name: full shape} of the whole GPT of config ``mcfg`` (Hugging Face's shapes)."""
    C, F, V, P = mcfg.d_model, mcfg.d_ff, mcfg.vocab_size, mcfg.n_positions
    shapes = {"wte.weight": (V, C), "wpe.weight": (P, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(mcfg.n_layer):
        for name, shape in (("ln_1.weight", (C,)), ("ln_1.bias", (C,)), ("attn.c_attn.weight", (C, 3 * C)),
                            ("attn.c_attn.bias", (3 * C,)), ("attn.c_proj.weight", (C, C)),
                            ("attn.c_proj.bias", (C,)), ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
                            ("mlp.c_fc.weight", (C, F)), ("mlp.c_fc.bias", (F,)),
                            ("mlp.c_proj.weight", (F, C)), ("mlp.c_proj.bias", (C,))):
            shapes[f"h.{i}.{name}"] = shape
    if not mcfg.tied:
        shapes["lm_head.weight"] = (V, C)
    return shapes


def check_tensors(source, found, expected):
    """Refuse ``found`` {name: shape} unless it is exactly ``expected``: nothing missing, nothing extra."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing or extra:
        def few(names):
            return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts = ([f"missing {few(missing)}"] if missing else []) + \
                ([f"tensors the model does not use: {few(extra)}"] if extra else [])
        raise UsageError(f"{source} does not match the model: " + "; ".join(parts))
    for name, shape in expected.items():
        if tuple(found[name]) != tuple(shape):
            raise UsageError(f"{source}: {name} has shape {tuple(found[name])}, the model needs {tuple(shape)}")


@dataclass(frozen=True)
class Architecture:
    n_layer: int
    d_model: int
    d_ff: int
    vocab_size: int
    n_positions: int
    tied: bool
    n_head: int          # 0: the file does not say
    ln_eps: float        # 0: the file does not say
    arch: str = "gpt2"   # the family (nn/architectures.py ARCHITECTURES); Llama's files: checkpoint/llama.py
    n_kv_head: int = 0   # Llama: key/value heads
    head_dim: int = 0    # Llama: features per head when not hidden_size / heads (config.json's head_dim)
    rope_theta: float = 0.0    # Llama: the rotary base
    n_expert: int = 0    # Mixtral, Qwen3-MoE: routed experts per layer (checkpoint/mixtral.py, qwen3_moe.py)
    top_k: int = 0       # ... experts per token
    norm_topk: bool = True     # ... the k chosen scores renormalised (Qwen3-MoE: its norm_topk_prob)
    qk_norm: bool = False      # Qwen3-MoE: RMSNorm over each head's queries and keys
    window: int = 0            # Mixtral, Qwen3-MoE: sliding-window attention (config.json's sliding_window)
    window_layers: str = ""    # ... in these layers ("": all; layer_types' "sliding_attention" ones)
    n_shared_expert: int = 0   # DeepSeek-V3 (checkpoint/deepseek_v3.py): the shared experts,
    router_score: str = "softmax"   # ... the router's scores,
    mtp_depth: int = 0         # ... the MTP modules the file holds,
    dims: str = ""             # ... and its further sizes (nn/dims.py's text)


def read_header(path, what):
    """({name: shape} of the parameters, metadata) read from the file's header alone."""
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(str(path), framework="np") as f:
            shapes = {parameter_name(k): tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            return {k: v for k, v in shapes.items() if k is not None}, f.metadata() or {}
    except FileNotFoundError:
        raise UsageError(f"{what}: {path} not found") from None
    except (SafetensorError, OSError) as err:
        raise UsageError(f"{what}: {path} is not a readable safetensors file: {err}") from None


# the kind (data.KINDS) of every config.json entry a family's reader takes, checked as the file is read
CONFIG_TYPES = {"model_type": "text", "architectures": "list", "n_head": "count", "n_layer": "count",
                "n_embd": "count", "vocab_size": "count", "n_positions": "count", "n_inner": "count?",
                "layer_norm_epsilon": "number", "tie_word_embeddings": "bool", "hidden_size": "count",
                "intermediate_size": "count", "num_hidden_layers": "count", "num_attention_heads": "count",
                "num_key_value_heads": "count", "head_dim": "count?", "max_position_embeddings": "count",
                "rms_norm_eps": "number", "rope_theta": "number", "rope_parameters": "object?",
                "num_experts_per_tok": "count", "num_local_experts": "count", "num_experts": "count",
                "norm_topk_prob": "bool"}


def read_config_json(path, what):
    """config.json beside the weights, or {} if there is none; an entry of the wrong kind is refused."""
    return read_optional_json((Path(path) if Path(path).is_dir() else Path(path).parent) / CONFIG, f"{what}: ",
                              CONFIG_TYPES)


def read_architecture(path, what="--init-from"):
    """The Architecture of the GPT-2 at ``path`` (a file or a save_pretrained directory); ``what``
    starts the error messages."""
    source = weights_file(path)
    shapes, meta = read_header(source, what)
    if "wte.weight" not in shapes or "wpe.weight" not in shapes or "h.0.mlp.c_fc.weight" not in shapes:
        raise UsageError(f"{what}: {source} is not a GPT-2 (no wte.weight, wpe.weight or h.0.mlp.c_fc.weight)")
    hf = read_config_json(path, what)
    unsupported = {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "scale_attn_weights": (True,),
                   "scale_attn_by_inverse_layer_idx": (False,), "add_cross_attention": (False,)}
    for key, allowed in unsupported.items():
        if key in hf and hf[key] not in allowed:
            raise UsageError(f"{what}: {key} = {hf[key]!r} in its config.json is not supported "
                             f"(hpcpar's GPT-2 has {allowed[0]!r})")
    tied = hf.get("tie_word_embeddings", True) if hf else "lm_head.weight" not in shapes
    if tied:
        shapes.pop("lm_head.weight", None)          # Hugging Face may store the tied head twice
    layers = {int(m.group(1)) for m in map(_LAYER.match, shapes) if m}
    V, C = shapes["wte.weight"]
    arch = Architecture(n_layer=max(layers) + 1, d_model=C, d_ff=shapes["h.0.mlp.c_fc.weight"][1], vocab_size=V,
                        n_positions=shapes["wpe.weight"][0], tied=tied,
                        n_head=int(hf.get("n_head", meta.get("n_head", 0))),
                        ln_eps=float(hf.get("layer_norm_epsilon", meta.get("layer_norm_epsilon", 0))))
    for key, value in (("n_layer", arch.n_layer), ("n_embd", C), ("vocab_size", V),
                       ("n_positions", arch.n_positions)):
        if key in hf and hf[key] != value:
            raise UsageError(f"{what}: its config.json says {key} = {hf[key]} but {source} holds {value}")
    from hpcpar.nn.gpt import GPTConfig
    check_tensors(source, shapes, expected_shapes(GPTConfig(
        vocab_size=V, seq_len=arch.n_positions, n_layer=arch.n_layer, d_model=C, d_ff=arch.d_ff, tied=tied)))
    return arch


def hf_config(mcfg):
    """The config.json of Hugging Face's GPT2LMHeadModel for our GPT of config ``mcfg``."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
            "vocab_size": mcfg.vocab_size, "n_positions": mcfg.n_positions, "n_embd": mcfg.d_model,
            "n_layer": mcfg.n_layer, "n_head": mcfg.n_head, "n_inner": mcfg.d_ff,
            "layer_norm_epsilon": mcfg.ln_eps, "tie_word_embeddings": mcfg.tied,
            "resid_pdrop": mcfg.dropout, "embd_pdrop": mcfg.dropout, "attn_pdrop": mcfg.dropout}


def file_metadata(mcfg):
    """The architecture a lone file must record beyond its tensors' shapes."""
    return {"n_head": mcfg.n_head, "layer_norm_epsilon": mcfg.ln_eps}
