"""Hugging Face files of the families the engine runs: GPT-2 (gpt2.py), Llama (llama.py), Mixtral
(mixtral.py: a Llama with mixtures of experts, whose experts the file holds one by one), Qwen3-MoE
(qwen3_moe.py: a Mixtral with QK-norm, its experts under other names) and DeepSeek-V3 (deepseek_v3.py:
latent attention, Qwen3-MoE's expert names, the MTP modules as layers after the model's).

What is the same for both lives here, once: which family a file holds (or which family it holds that
hpcpar does not implement), taking a run's family and dimensions from it (``--init-from``), and the way between a file's tensors and our parameters - the family's prefix
(``transformer.`` or ``model.``; ``lm_head.weight`` has none) and, for Llama's projections, a transpose.
"""
from hpcpar.checkpoint import deepseek_v3, gpt2, llama, mixtral, qwen3_moe
from hpcpar.nn.dims import dims_text, parse_dims
from hpcpar.nn.architectures import ARCHITECTURES
from hpcpar.runtime import UsageError

FAMILIES = {"gpt2": gpt2, "llama": llama, "deepseek_v3": deepseek_v3}   # the module that reads and writes each
FILE_FAMILIES = dict(FAMILIES, mixtral=mixtral, qwen3_moe=qwen3_moe)   # family's files, and each a file may hold
WITH_EXPERTS = (mixtral, qwen3_moe)             # the families whose files hold experts one by one
PRESET_OF = {"gpt2": "tiny", "llama": "llama-tiny", "mixtral": "mixtral-tiny",     # --model for a file of it
             "qwen3_moe": "qwen3-moe-tiny", "deepseek_v3": "deepseek-tiny"}
HF_NAMES = {"gpt2": "GPT-2 (GPT2LMHeadModel)", "llama": "Llama (LlamaForCausalLM)",
            "mixtral": "Mixtral (MixtralForCausalLM)", "qwen3_moe": "Qwen3-MoE (Qwen3MoeForCausalLM)",
            "deepseek_v3": "DeepSeek-V3 (DeepseekV3ForCausalLM)"}
# what makes a Hugging Face model a mixture of experts: keys of its config.json (Mixtral, Qwen-MoE,
# DeepSeek, ...), and a piece of its tensor names
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
EXPERT_TENSOR = ".experts."


def parameter_name(key):
    """A file's tensor name (either family, prefixed or not) -> our parameter name, or None for a buffer."""
    return gpt2.parameter_name(key.removeprefix(llama.PREFIX))


def file_key(name, arch):
    """Our parameter name -> its name in a save_pretrained directory of family ``arch``."""
    return name if name == "lm_head.weight" else ARCHITECTURES[arch].hf_prefix + name


def file_layout(name, array):
    """Our (in, out) layout <-> the file's: a transpose for a torch Linear weight (its own inverse)."""
    return array.T if llama.transposed(name) else array


def family(mcfg):
    """The module of the Hugging Face family of our model: a Llama with experts is a Mixtral, with QK-norm
    too a Qwen3-MoE.  One line for a model no family's file can hold."""
    held = model_family(mcfg)
    if mcfg.window and (held not in ("mixtral", "qwen3_moe") or mcfg.window_layers):
        some = f" in layers {mcfg.window_layers}" if mcfg.window_layers else ""
        raise UsageError(f"a {mcfg.parts.title} with a sliding window{some} has no Hugging Face model to write "
                         f"(Mixtral and Qwen3-MoE files window every layer): keep it as a checkpoint (--save)")
    if mcfg.mtp_depth and not mcfg.parts.latent:
        raise UsageError(f"a {mcfg.parts.title} with MTP modules has no Hugging Face model to write (DeepSeek-V3's "
                         f"files hold them): keep it as a checkpoint (--save)")
    if not mcfg.n_expert:
        return FAMILIES[mcfg.arch]
    if not held:
        raise UsageError(f"a {mcfg.parts.title} with experts has no Hugging Face model to write: keep it as a "
                         f"checkpoint (--save)")
    if held == "mixtral" and not mcfg.norm_topk:
        raise UsageError("a Llama with experts whose top-k scores are not renormalised (--no-norm-topk) has no "
                         "Hugging Face model to write (Mixtral renormalises them): keep it as a checkpoint (--save)")
    return FILE_FAMILIES[held]


def expected_shapes(mcfg):
    return family(mcfg).expected_shapes(mcfg)


def hf_config(mcfg):
    return family(mcfg).hf_config(mcfg)


def file_metadata(mcfg):
    """What a lone .safetensors file (no config.json beside it) records of its model, as strings."""
    return {k: str(v) for k, v in family(mcfg).file_metadata(mcfg).items()}


def from_file(tensors):
    """A file's tensors (our names, each in our layout) -> our parameters: a Mixtral's or a Qwen3-MoE's
    experts stacked (each family's names are its own; DeepSeek-V3's are Qwen3-MoE's), a DeepSeek-V3's MTP
    modules' copies of the embedding and head dropped."""
    tensors = deepseek_v3.without_copies(tensors)
    for held in WITH_EXPERTS:
        if held.NAMES.held_by(tensors):
            return mixtral.stacked(tensors, held.NAMES)
    return tensors


def to_file(weights, mcfg):
    """Our parameters -> the tensors of the file of its family (the inverse of ``from_file``)."""
    held = family(mcfg)
    if held is deepseek_v3:
        return deepseek_v3.to_file(weights, mcfg)
    return mixtral.unstacked(weights, mcfg.n_layer, held.NAMES) if held in WITH_EXPERTS else weights


def model_family(mcfg):
    """The key of FILE_FAMILIES a model of ours is written as ("" for none: a GPT-2 with experts)."""
    if not mcfg.n_expert:
        return mcfg.arch
    return "qwen3_moe" if mcfg.qk_norm and mcfg.parts.hf_with_experts else mcfg.parts.hf_with_experts


def file_family(path, what="--init-from"):
    """The family of the model at ``path`` (a key of FILE_FAMILIES): its config.json's model_type, else
    its tensor names.  A family hpcpar does not implement is refused with one line that names it."""
    hf = gpt2.read_config_json(path, what)
    kind = hf.get("model_type")
    if kind in FILE_FAMILIES:
        return kind
    runs = ", ".join(HF_NAMES.values())
    if kind:
        name = (hf.get("architectures") or [f"model_type {kind!r}"])[0]
        moe = ": a mixture of experts hpcpar does not implement" if any(key in hf for key in EXPERT_KEYS) else \
            ", a family hpcpar does not implement"
        raise UsageError(f"{what} {path} holds a {name}{moe} (it runs {runs})")
    if gpt2.read_header(gpt2.weights_file(path), what)[1].get("model_type") == "deepseek_v3":
        return "deepseek_v3"                    # a lone file of ours (its experts are named as Qwen3-MoE's)
    if mixtral.holds_mixtral(path, what):
        return "mixtral"
    if qwen3_moe.holds_qwen3_moe(path, what):
        return "qwen3_moe"
    names = {key.removeprefix(llama.PREFIX) for key in gpt2.read_header(gpt2.weights_file(path), what)[0]}
    if any(EXPERT_TENSOR in name for name in names):
        raise UsageError(f"{what} {path} holds a mixture of experts (tensors named *{EXPERT_TENSOR}*) that is "
                         f"neither a Mixtral nor a Qwen3-MoE, which hpcpar does not implement (it runs {runs})")
    return "llama" if "embed_tokens.weight" in names else "gpt2"      # gpt2 names what a GPT-2 lacks


def read_architecture(path, what="--init-from"):
    return FILE_FAMILIES[file_family(path, what)].read_architecture(path, what)


def adopt(cfg):
    """Take the run's model family (unless --model is given) and dimensions from ``--init-from``;
    refuse flags that contradict the file."""
    from hpcpar.nn.gpt import PRESETS as MODELS
    held = file_family(cfg.init_from)
    arch = FILE_FAMILIES[held].read_architecture(cfg.init_from, "--init-from")
    where = f"--init-from {cfg.init_from}"
    if not cfg.model:
        cfg.model = PRESET_OF[held]
    elif cfg.model not in MODELS or model_family(MODELS[cfg.model]) != held:
        raise UsageError(f"--model {cfg.model} contradicts {where}, which holds a {HF_NAMES[held]} "
                         f"(without --model the family comes from the file)")
    for flag, attr, theirs in (("layers", "layers", arch.n_layer), ("hidden", "hidden", arch.d_model),
                               ("ffn", "ffn", arch.d_ff), ("vocab", "vocab", arch.vocab_size),
                               ("heads", "heads", arch.n_head), ("kv-heads", "kv_heads", arch.n_kv_head),
                               ("positions", "positions", arch.n_positions), ("ln-eps", "ln_eps", arch.ln_eps),
                               ("rope-theta", "rope_theta", arch.rope_theta), ("experts", "experts", arch.n_expert),
                               ("top-k", "top_k", arch.top_k), ("window", "window", arch.window),
                               ("window-layers", "window_layers", arch.window_layers),
                               ("shared-experts", "shared_experts", arch.n_shared_expert), ("mtp", "mtp", arch.mtp_depth)):
        mine = getattr(cfg, attr)
        if mine and theirs and mine != theirs:
            raise UsageError(f"--{flag} {mine} contradicts {where}, which has {theirs}")
        setattr(cfg, attr, mine or theirs)
    width = arch.head_dim or arch.d_model // arch.n_head       # the file's head width (0 stored: C / NH)
    if cfg.head_dim and cfg.head_dim != width:
        raise UsageError(f"--head-dim {cfg.head_dim} contradicts {where}, which has {width}")
    cfg.head_dim = cfg.head_dim or arch.head_dim
    if arch.n_expert and not cfg.norm_topk and arch.norm_topk:
        raise UsageError(f"--no-norm-topk contradicts {where}, which renormalises its top-k scores")
    cfg.norm_topk = arch.norm_topk
    if arch.dims:                                # DeepSeek-V3's further sizes: the file's, unless --dims contradicts
        mine, theirs = parse_dims(cfg.dims), parse_dims(arch.dims)
        for name, value in mine.items():
            if theirs.get(name, value) != value:
                raise UsageError(f"--dims {name}={value} contradicts {where}, which has {theirs[name]}")
        cfg.dims = dims_text({**theirs, **mine})
        cfg.router_score = arch.router_score
    if cfg.untied and arch.tied:
        raise UsageError(f"--untied contradicts {where}, whose output head is the tied token embedding")
    cfg.untied = not arch.tied and not ARCHITECTURES[arch.arch].own_head_only   # a Llama's head is always its own
    if not cfg.heads:
        raise UsageError(f"{where} does not say its number of attention heads: give --heads, or put its "
                         f"config.json beside it")
    if arch.n_positions and cfg.seq_len > arch.n_positions:
        raise UsageError(f"--seq-len {cfg.seq_len} is longer than the {arch.n_positions} positions of {where}")
    cfg.seq_len = cfg.seq_len or arch.n_positions
    return cfg
