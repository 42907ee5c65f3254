"""Consolidated weights: one safetensors file with the Hugging Face names and shapes (GPT-2 or Llama).

Our parameter names already are GPT-2's (``wte.weight``, ``h.0.attn.c_attn.weight`` of shape (in, out),
``ln_f.weight``, ...; ``lm_head.weight`` when untied), so exporting is gathering the full tensors, and
importing a GPT-2 checkpoint is dropping what is not a parameter: the ``transformer.`` prefix of
GPT2LMHeadModel files and the attention-mask buffers (``h.N.attn.bias``, ``h.N.attn.masked_bias``).

``--export model.safetensors`` writes the one file (with the heads and LayerNorm epsilon in its
metadata); ``--export DIR`` writes what ``GPT2LMHeadModel.from_pretrained(DIR)`` reads:
``model.safetensors`` with the ``transformer.`` prefix, ``config.json``, and the training data's
tokenizer when it has one.  A Llama goes the same way with its own prefix (``model.``), config.json
(LlamaForCausalLM's) and its projections transposed to torch's (out, in) (checkpoint/llama.py); what the
two families share is in checkpoint/hf.py.
"""
import shutil
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as safetensors_bytes

from hpcpar.checkpoint.files import CheckpointError, finite, write_atomic, write_json
from hpcpar.checkpoint.gpt2 import CONFIG, WEIGHTS, check_tensors, weights_file
from hpcpar.checkpoint.hf import (expected_shapes, file_key, file_layout, file_metadata, from_file, hf_config,
                                  parameter_name, to_file)
from hpcpar.checkpoint.pieces import apply, rank_tensors
from hpcpar.nn.parameter import Shard
from hpcpar.runtime import UsageError, agree


def read_weights(path):
    """{parameter name: array} from a consolidated file or a save_pretrained directory."""
    path = weights_file(path)
    try:
        with safe_open(str(path), framework="np") as f:
            out = {}
            for key in f.keys():
                name = parameter_name(key)
                if name is not None:
                    out[name] = file_layout(name, f.get_tensor(key))      # our (in, out) layout
                    finite(key, out[name], str(path))                     # NaN weights would train NaN
            return from_file(out)
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
        # all or nothing: every tensor the model has, of its shape, and no other, before any is loaded
        check_tensors(path, {n: w.shape for n, w in weights.items()}, expected_shapes(trainer.mcfg))
        apply(trainer, weights.__getitem__, ())
    except CheckpointError as err:
        error = UsageError(f"--init-from: {err}")          # a file the user named: exit 2, like any bad input
    except UsageError as err:
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


def write_weights(weights, path, metadata=None):
    """One safetensors file, Hugging Face's metadata and layouts, written atomically."""
    data = safetensors_bytes({k: np.ascontiguousarray(file_layout(k, v)) for k, v in weights.items()},
                             metadata={"format": "pt", **(metadata or {})})
    write_atomic(Path(path), data)


def write_pretrained(weights, mcfg, directory, tokenizer=None):
    """A directory GPT2LMHeadModel (LlamaForCausalLM).from_pretrained loads: prefixed weights, config.json,
    tokenizer."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    prefixed = {file_key(k, mcfg.arch): v for k, v in weights.items()}
    write_weights(prefixed, directory / WEIGHTS)
    write_json(directory / CONFIG, hf_config(mcfg))
    if tokenizer is not None and Path(tokenizer).is_file():
        shutil.copyfile(tokenizer, directory / Path(tokenizer).name)


def export(trainer, path, tokenizer=None):
    """Collective: write the model's full weights to ``path`` (rank 0 writes): a .safetensors file, or
    else a save_pretrained directory (with ``tokenizer``, a tokenizer.json, copied beside them)."""
    weights = gather_full(trainer)
    error = None
    if weights is not None:
        try:
            for name, w in weights.items():
                finite(name, w, f"not exporting to {path}: the weights are not finite")
            weights = to_file(weights, trainer.mcfg)
            if Path(path).suffix == ".safetensors":
                write_weights(weights, path, file_metadata(trainer.mcfg))
            else:
                write_pretrained(weights, trainer.mcfg, path, tokenizer)
        except (CheckpointError, OSError) as err:
            error = err
    agree(trainer.grid.world_comm.mpi, error)
