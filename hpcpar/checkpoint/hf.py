"""Hugging Face files of both families the engine runs: GPT-2 (gpt2.py) and Llama (llama.py).

What is the same for both lives here, once: which family a file holds, taking a run's dimensions from
it (``--init-from``), and the way between a file's tensors and our parameters - the family's prefix
(``transformer.`` or ``model.``; ``lm_head.weight`` has none) and, for Llama's projections, a transpose.
"""
from hpcpar.checkpoint import gpt2, llama
from hpcpar.nn.gpt import ARCHITECTURES, PRESETS
from hpcpar.runtime import UsageError

FAMILIES = {"gpt2": gpt2, "llama": llama}     # the module that reads and writes each family's files


def parameter_name(key):
    """A file's tensor name (either family, prefixed or not) -> our parameter name, or None for a buffer."""
    return gpt2.parameter_name(key.removeprefix(llama.PREFIX))


def file_key(name, arch):
    """Our parameter name -> its name in a save_pretrained directory of family ``arch``."""
    return name if name == "lm_head.weight" else ARCHITECTURES[arch].hf_prefix + name


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


def read_architecture(path, what="--init-from"):
    return (llama if llama.holds_llama(path, what) else gpt2).read_architecture(path, what)


def adopt(cfg):
    """Take the run's model dimensions from ``--init-from``; refuse flags that contradict the file."""
    arch = read_architecture(cfg.init_from)
    where = f"--init-from {cfg.init_from}"
    if cfg.model in PRESETS and PRESETS[cfg.model].arch != arch.arch:
        preset = next(name for name, p in PRESETS.items() if p.arch == arch.arch and not p.vocab_size)
        raise UsageError(f"{where} holds a {ARCHITECTURES[arch.arch].title}: use --model {preset} (its "
                         f"dimensions come from the file), not --model {cfg.model}")
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
    cfg.untied = not arch.tied and not ARCHITECTURES[arch.arch].own_head_only   # a Llama's head is always its own
    if not cfg.heads:
        raise UsageError(f"{where} does not say its number of attention heads: give --heads, or put its "
                         f"config.json beside it")
    if arch.n_positions and cfg.seq_len > arch.n_positions:
        raise UsageError(f"--seq-len {cfg.seq_len} is longer than the {arch.n_positions} positions of {where}")
    cfg.seq_len = cfg.seq_len or arch.n_positions
    return cfg
