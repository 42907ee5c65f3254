"""Hugging Face files of the families the engine runs: GPT-2 (gpt2.py), Llama (llama.py) and Mixtral
(mixtral.py: a Llama with mixtures of experts, whose experts the file holds one by one).

What is the same for both lives here, once: which family a file holds, taking a run's dimensions from
it (``--init-from``), and the way between a file's tensors and our parameters - the family's prefix
(``transformer.`` or ``model.``; ``lm_head.weight`` has none) and, for Llama's projections, a transpose.
"""
from hpcpar.checkpoint import gpt2, llama, mixtral
from hpcpar.nn.gpt import ARCHITECTURES
from hpcpar.runtime import UsageError

FAMILIES = {"gpt2": gpt2, "llama": llama}     # the module that reads and writes each family's files
# the Hugging Face family each preset's files hold (the rest: GPT-2's)
_PRESET_FAMILY = {"llama-tiny": "llama", "llama-small": "llama", "mixtral-tiny": "mixtral", "moe-tiny": "none"}


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
    """The module of the Hugging Face family of our model: a Llama with experts is a Mixtral."""
    if not mcfg.n_expert:
        return FAMILIES[mcfg.arch]
    if not mcfg.parts.hf_with_experts:
        raise UsageError(f"a {mcfg.parts.title} with experts has no Hugging Face model to write: keep it as a "
                         f"checkpoint (--save)")
    return {"mixtral": mixtral}[mcfg.parts.hf_with_experts]


def expected_shapes(mcfg):
    return family(mcfg).expected_shapes(mcfg)


def hf_config(mcfg):
    return family(mcfg).hf_config(mcfg)


def file_metadata(mcfg):
    """What a lone .safetensors file (no config.json beside it) records of its model, as strings."""
    return {k: str(v) for k, v in family(mcfg).file_metadata(mcfg).items()}


def from_file(tensors):
    """A file's tensors (our names, each in our layout) -> our parameters: a Mixtral's experts stacked."""
    return mixtral.stacked(tensors)


def to_file(weights, mcfg):
    """Our parameters -> the tensors of the file of its family (the inverse of ``from_file``)."""
    return mixtral.unstacked(weights, mcfg.n_layer) if family(mcfg) is mixtral else weights


def read_architecture(path, what="--init-from"):
    if mixtral.holds_mixtral(path, what):
        return mixtral.read_architecture(path, what)
    return (llama if llama.holds_llama(path, what) else gpt2).read_architecture(path, what)


def adopt(cfg):
    """Take the run's model dimensions from ``--init-from``; refuse flags that contradict the file."""
    arch = read_architecture(cfg.init_from)
    where = f"--init-from {cfg.init_from}"
    held = "mixtral" if arch.n_expert else arch.arch
    if held != _PRESET_FAMILY.get(cfg.model, "gpt2"):
        family = {"mixtral": "a Mixtral: use --model mixtral-tiny", "llama": "a Llama: use --model llama-tiny",
                  "gpt2": "a GPT-2: use --model tiny"}[held]
        raise UsageError(f"{where} holds {family} (its dimensions come from the file), not --model {cfg.model}")
    for flag, attr, theirs in (("layers", "layers", arch.n_layer), ("hidden", "hidden", arch.d_model),
                               ("ffn", "ffn", arch.d_ff), ("vocab", "vocab", arch.vocab_size),
                               ("heads", "heads", arch.n_head), ("kv-heads", "kv_heads", arch.n_kv_head),
                               ("positions", "positions", arch.n_positions), ("ln-eps", "ln_eps", arch.ln_eps),
                               ("rope-theta", "rope_theta", arch.rope_theta), ("experts", "experts", arch.n_expert),
                               ("top-k", "top_k", arch.top_k)):
        mine = getattr(cfg, attr)
        if mine and theirs and mine != theirs:
            raise UsageError(f"--{flag} {mine} contradicts {where}, which has {theirs}")
        setattr(cfg, attr, mine or theirs)
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
