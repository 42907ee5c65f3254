"""Hugging Face files of both families the engine runs: GPT-2 (gpt2.py) and Llama (llama.py).

What is the same for both lives here, once: which family a file holds (or which family it holds that
hpcpar does not implement), taking a run's family and dimensions from it (``--init-from``), and the way between a file's tensors and our parameters - the family's prefix
(``transformer.`` or ``model.``; ``lm_head.weight`` has none) and, for Llama's projections, a transpose.
"""
from hpcpar.checkpoint import gpt2, llama
from hpcpar.runtime import UsageError

FAMILIES = {"gpt2": gpt2, "llama": llama}
PREFIXES = {"gpt2": "transformer.", "llama": llama.PREFIX}
PRESETS = {"gpt2": "tiny", "llama": "llama-tiny"}    # --model for a file of the family (dimensions: the file's)
HF_NAMES = {"gpt2": "GPT-2 (GPT2LMHeadModel)", "llama": "Llama (LlamaForCausalLM)"}
# what makes a Hugging Face model a mixture of experts: keys of its config.json (Mixtral, Qwen-MoE,
# DeepSeek, ...), and a piece of its tensor names
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
EXPERT_TENSOR = ".experts."


def parameter_name(key):
    """A file's tensor name (either family, prefixed or not) -> our parameter name, or None for a buffer."""
    return gpt2.parameter_name(key.removeprefix(llama.PREFIX))


def file_key(name, arch):
    """Our parameter name -> its name in a save_pretrained directory of family ``arch``."""
    return name if name == "lm_head.weight" else PREFIXES[arch] + name


def file_layout(name, array):
    """Our (in, out) layout <-> the file's: a transpose for a torch Linear weight (its own inverse)."""
    return array.T if llama.transposed(name) else array


def expected_shapes(mcfg):
    return FAMILIES[mcfg.arch].expected_shapes(mcfg)


def hf_config(mcfg):
    return FAMILIES[mcfg.arch].hf_config(mcfg)


def file_metadata(mcfg):
    """What a lone .safetensors file (no config.json beside it) records of its model, as strings."""
    return {k: str(v) for k, v in FAMILIES[mcfg.arch].file_metadata(mcfg).items()}


def family(path, what="--init-from"):
    """The family of the model at ``path`` (a key of FAMILIES): its config.json's model_type, else its
    tensor names.  A family hpcpar does not implement is refused with one line that names it."""
    hf = gpt2.read_config_json(path, what)
    kind = hf.get("model_type")
    if kind in FAMILIES:
        return kind
    if kind:
        name = (hf.get("architectures") or [f"model_type {kind!r}"])[0]
        if any(key in hf for key in EXPERT_KEYS):
            raise UsageError(f"{what} {path} holds a {name}: a mixture of experts, which hpcpar does not "
                             f"implement yet")
        raise UsageError(f"{what} {path} holds a {name}, a family hpcpar does not implement (it runs "
                         f"{' and '.join(HF_NAMES.values())})")
    names = {key.removeprefix(llama.PREFIX) for key in gpt2.read_header(gpt2.weights_file(path), what)[0]}
    if any(EXPERT_TENSOR in name for name in names):
        raise UsageError(f"{what} {path} holds a mixture of experts (tensors named *{EXPERT_TENSOR}*), which "
                         f"hpcpar does not implement yet")
    return "llama" if "embed_tokens.weight" in names else "gpt2"      # gpt2 names what a GPT-2 lacks


def read_architecture(path, what="--init-from"):
    return FAMILIES[family(path, what)].read_architecture(path, what)


def adopt(cfg):
    """Take the run's model family (unless --model is given) and dimensions from ``--init-from``;
    refuse flags that contradict the file."""
    from hpcpar.nn.gpt import PRESETS as MODELS
    arch = read_architecture(cfg.init_from)
    where = f"--init-from {cfg.init_from}"
    if not cfg.model:
        cfg.model = PRESETS[arch.arch]
    elif cfg.model not in MODELS or MODELS[cfg.model].arch != arch.arch:
        raise UsageError(f"--model {cfg.model} contradicts {where}, which holds a {HF_NAMES[arch.arch]} "
                         f"(without --model the family comes from the file)")
    for flag, attr, theirs in (("layers", "layers", arch.n_layer), ("hidden", "hidden", arch.d_model),
                               ("ffn", "ffn", arch.d_ff), ("vocab", "vocab", arch.vocab_size),
                               ("heads", "heads", arch.n_head), ("kv-heads", "kv_heads", arch.n_kv_head),
                               ("positions", "positions", arch.n_positions), ("ln-eps", "ln_eps", arch.ln_eps),
                               ("rope-theta", "rope_theta", arch.rope_theta)):
        mine = getattr(cfg, attr)
        if mine and theirs and mine != theirs:
            raise UsageError(f"--{flag} {mine} contradicts {where}, which has {theirs}")
        setattr(cfg, attr, mine or theirs)
    if cfg.untied and arch.tied:
        raise UsageError(f"--untied contradicts {where}, whose output head is the tied token embedding")
    cfg.untied = not arch.tied and arch.arch == "gpt2"        # a Llama's head is always its own
    if not cfg.heads:
        raise UsageError(f"{where} does not say its number of attention heads: give --heads, or put its "
                         f"config.json beside it")
    if arch.n_positions and cfg.seq_len > arch.n_positions:
        raise UsageError(f"--seq-len {cfg.seq_len} is longer than the {arch.n_positions} positions of {where}")
    cfg.seq_len = cfg.seq_len or arch.n_positions
    return cfg
