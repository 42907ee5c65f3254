"""Consolidated weights: one safetensors file with the Hugging Face GPT-2 names and shapes.

Our parameter names already are GPT-2's (``wte.weight``, ``h.0.attn.c_attn.weight`` of shape (in, out),
``ln_f.weight``, ...; ``lm_head.weight`` when untied), so exporting is gathering the full tensors, and
importing a GPT-2 checkpoint is dropping what is not a parameter: the ``transformer.`` prefix of
GPT2LMHeadModel files and the attention-mask buffers (``h.N.attn.bias``, ``h.N.attn.masked_bias``).
"""
import re
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as safetensors_bytes

from hpcpar.checkpoint.files import CheckpointError, write_atomic
from hpcpar.checkpoint.pieces import apply, rank_tensors
from hpcpar.nn.parameter import Shard
from hpcpar.runtime import agree

_BUFFER = re.compile(r"^h\.\d+\.attn\.(masked_)?bias$")


def gpt2_name(key):
    """A file's tensor name -> our parameter name, or None for a non-parameter buffer."""
    key = key.removeprefix("transformer.")
    return None if _BUFFER.match(key) else key


def read_weights(path):
    """{parameter name: array} from a consolidated file (ours or Hugging Face's)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="np") as f:
            out = {}
            for key in f.keys():
                name = gpt2_name(key)
                if name is not None:
                    out[name] = f.get_tensor(key)
            return out
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors file: {err}") from None


def init_from(trainer, path):
    """Collective: load consolidated weights into any layout (the optimizer starts fresh)."""
    error = None
    try:
        weights = read_weights(path)
        if trainer.mcfg.tied and "lm_head.weight" in weights:
            weights.pop("lm_head.weight")          # Hugging Face files may store the tied head twice

        def full(name):
            if name not in weights:
                raise CheckpointError(f"{path} has no tensor {name!r} (is it a GPT-2 of this shape?)")
            return weights[name]
        apply(trainer, full, ())
    except CheckpointError as err:
        error = err
    agree(trainer.grid.world_comm.mpi, error)


def gather_full(trainer):
    """Collective: {name: full array} on world rank 0 (None elsewhere). A once-per-run gather of
    whole tensors: the lowercase, pickling mpi4py gather keeps this short, and it is off the hot path."""
    tensors, layout = rank_tensors(trainer, optimizer=False)
    mine = {n: (tensors[n], layout[n][0], layout[n][1]) for n in layout}
    everyone = trainer.grid.world_comm.mpi.gather(mine, root=0)
    if everyone is None:
        return None
    pieces = {}
    for per_rank in everyone:
        for name, (arr, shard, full_shape) in per_rank.items():
            pieces.setdefault(name, {})[0 if shard is None else shard.index] = (arr, shard, full_shape)
    out = {}
    for name, parts in pieces.items():
        arr, shard, full_shape = parts[0]
        out[name] = arr if shard is None else \
            Shard(shard.dim, shard.parts, 0, shard.groups).assemble([parts[i][0] for i in range(shard.parts)],
                                                                    full_shape)
    return out


def write_weights(weights, path):
    """One safetensors file, Hugging Face's metadata, written atomically."""
    data = safetensors_bytes({k: np.ascontiguousarray(v) for k, v in weights.items()}, metadata={"format": "pt"})
    write_atomic(Path(path), data)


def export(trainer, path):
    """Collective: write the model's full weights to ``path`` (rank 0 writes)."""
    weights = gather_full(trainer)
    error = None
    if weights is not None:
        try:
            write_weights(weights, path)
        except CheckpointError as err:
            error = err
    agree(trainer.grid.world_comm.mpi, error)
