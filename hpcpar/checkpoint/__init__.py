"""Checkpoints: stop anywhere, resume exactly, move to another layout, never lose the last good one.

On disk (docs/checkpoints.md):

    DIR/latest                       the name of the newest complete step directory (atomically replaced)
    DIR/lock                         the run writing here (host, pid, Slurm job)
    DIR/step-00000120/manifest.json  layout, model, optimizer, every tensor's full shape, dtype and
                                     sharding, and the SHA-256 of every file
    DIR/step-00000120/rank-00003.safetensors   the pieces this rank held (parameters, optimizer state)

A tensor is stored as the pieces its layout cut it into, with the cut (dimension, parts, groups)
recorded, so any other layout can load it: read the pieces, assemble the full tensor, take its own
shard.  That one rule is resume, resharding and conversion.

files.py      atomic writes, checksums, an atomic swap, a probe of a directory, finite numbers
directory.py  a checkpoint directory's steps: publishing, recovering an interrupted publish, rotation
lock.py       one run writing a checkpoint directory at a time
manifest.py   what a manifest records (the resolved model, the run), and what a resume checks
pieces.py     what a rank saves, and how loaded full tensors go back into a Trainer
save.py       the collective save protocol
load.py       finding, verifying and loading the latest complete checkpoint
consolidated.py  GPT-2-named safetensors weights (export, --init-from)
gpt2.py       Hugging Face GPT-2 files: the architecture a file holds, config.json
llama.py      Hugging Face Llama files: the same, and which matrices torch stores transposed
mixtral.py    Hugging Face Mixtral files: a Llama's, with the experts one by one (stacked in hpcpar)
qwen3_moe.py  Hugging Face Qwen3-MoE files: a Mixtral's under other names, with QK-norm
hf.py         what the families share: which one a file holds, --init-from's dimensions, names and layouts
convert.py    `hpcpar checkpoint convert` / `inspect` (no MPI needed)
"""
from hpcpar.checkpoint.load import load_checkpoint, latest_checkpoint
from hpcpar.checkpoint.save import save_checkpoint

__all__ = ["load_checkpoint", "latest_checkpoint", "save_checkpoint"]
