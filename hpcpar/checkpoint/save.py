"""The collective save protocol.  Every step that can fail is followed by ``agree``: if any rank
failed, every rank raises the same error and the previous checkpoint stays as it was.

 1. rank 0 creates DIR/step-N.partial (a stale one from an interrupted save is removed first)
 2. every writing rank writes its file there atomically and computes its SHA-256
 3. rank 0 writes manifest.json, renames step-N.partial -> step-N, then replaces ``latest``
 4. rank 0 deletes all but the newest ``keep`` step directories
Only after step 3 does the new checkpoint exist for a reader, and it exists whole.
"""
import shutil
from pathlib import Path

from safetensors.numpy import save as safetensors_bytes

from hpcpar.checkpoint.files import FORMAT, CheckpointError, fsync_dir, sha256, write_atomic, write_json
from hpcpar.checkpoint.pieces import rank_tensors
from hpcpar.runtime import agree


def step_name(step):
    return f"step-{step:08d}"


def _attempt(fn):
    """Run fn; return None or the exception it raised (to be agreed on)."""
    try:
        fn()
        return None
    except (OSError, CheckpointError) as err:
        return err


def manifest(trainer, step, layouts, files, state_names):
    cfg = trainer.cfg
    tensors = {}
    for rank_file, layout in layouts:
        for name, (shard, full_shape, dtype) in layout.items():
            entry = tensors.setdefault(name, {"shape": list(full_shape), "dtype": dtype, "files": {}})
            part = 0 if shard is None else shard.index
            if shard is not None:
                entry.update(dim=shard.dim, parts=shard.parts, groups=shard.groups)
            entry["files"][str(part)] = rank_file
    return {
        "format": FORMAT,
        "step": step,
        "layout": {"tp": cfg.tp, "cp": cfg.cp, "pp": cfg.pp, "dp": cfg.dp, "schedule": cfg.schedule,
                   "microbatches": cfg.microbatches, "chunks": cfg.chunks, "zero": cfg.zero,
                   "sequence_parallel": cfg.sequence_parallel},
        "config": {k: v for k, v in vars(cfg).items()},
        "optimizer": {"name": cfg.optimizer, "t": trainer.optimizer.t, "states": list(state_names)},
        "loss_scale": {"scale": trainer.scaler.scale, "good_steps": trainer.scaler.good_steps},
        "tensors": tensors,
        "files": files,
    }


def save_checkpoint(trainer, directory, step, keep=3):
    """Collective: write the state after ``step`` completed steps to DIR/step-<step>."""
    tensors, layout = rank_tensors(trainer)
    mine = {f"rank-{trainer.grid.rank_id:05d}.safetensors": (tensors, layout)} if tensors else {}
    return write_checkpoint(trainer, trainer.grid.world_comm.mpi, directory, step, keep, mine)


def write_checkpoint(meta, comm, directory, step, keep, mine):
    """Collective over ``comm``: the protocol above, for this rank's files ``mine`` {file name: (tensors,
    layout)} (several when it writes pieces kept in memory, checkpoint/memory.py).  ``meta``: the Trainer,
    or anything with its cfg, optimizer and scaler, for the manifest."""
    rank = comm.rank
    root = Path(directory)
    partial, final = root / (step_name(step) + ".partial"), root / step_name(step)

    def prepare():
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
    agree(comm, _attempt(prepare) if rank == 0 else None)

    names = {k.split("/")[1] for tensors, _ in mine.values() for k in tensors if k.startswith("optimizer/")}
    state_names = [n for n in meta.optimizer.state_names if n in names]
    info = {}

    def write():
        for rank_file, (tensors, _) in mine.items():
            data = safetensors_bytes(tensors, metadata={"format": FORMAT, "step": str(step)})
            write_atomic(partial / rank_file, data, rank)
            info[rank_file] = dict(sha256=sha256(partial / rank_file), bytes=len(data))
    agree(comm, _attempt(write) if mine else None)

    everyone = comm.gather(([(f, info[f], {n: (s, shape, str(tensors[n].dtype)) for n, (s, shape) in layout.items()})
                             for f, (tensors, layout) in mine.items()], state_names), root=0)

    def publish():
        written = [entry for files, _ in everyone for entry in files]
        names = max((s for _, s in everyone), key=len)
        write_json(partial / "manifest.json",
                   manifest(meta, step, [(f, lay) for f, _, lay in written], {f: i for f, i, _ in written}, names))
        fsync_dir(partial)
        old = root / (step_name(step) + ".old")
        if final.exists():
            final.rename(old)
        partial.rename(final)
        fsync_dir(root)
        write_atomic(root / "latest", (step_name(step) + "\n").encode())
        shutil.rmtree(old, ignore_errors=True)
        steps = sorted(d for d in root.glob("step-*") if d.is_dir() and not d.name.endswith((".partial", ".old")))
        for d in steps[:-keep]:
            shutil.rmtree(d, ignore_errors=True)
    agree(comm, _attempt(publish) if rank == 0 else None)
    return final
