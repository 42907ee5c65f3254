"""What a run writes, made safe before its first step (docs/checkpoints.md, "What is never deleted").

* Every output place is probed - its directory made and a file written there and removed - by rank 0
  for the files rank 0 writes (--metrics, --trace, --summary-json, --export) and by every rank for the
  checkpoint directory (each rank writes its own pieces).  A place that cannot be written is refused in
  one line before the first step, not found at the first save after hours of work.
* The checkpoint directory is locked (checkpoint/lock.py): a second run saving there is refused.
* A run saves into a directory that holds steps only when it resumed from them: a --save (without
  --resume of that directory) into another run's directory is refused, because its steps and the new
  ones would mix.  The run id in each manifest (``run_id``) tells a run's own steps from others'.

All collective; each refusal is a UsageError on every rank (exit 2) and leaves the directory as it was.
"""
import uuid
from pathlib import Path

from hpcpar.checkpoint import latest_checkpoint, lock
from hpcpar.checkpoint.directory import run_of, steps
from hpcpar.checkpoint.files import CheckpointError, probe
from hpcpar.runtime import UsageError, agree


def checkpoint_dir(cfg):
    """Where the run saves: --save, else the --resume directory."""
    return cfg.save or cfg.resume


def _attempt(fn, *args):
    """(fn(*args), None), or (None, the UsageError to agree on)."""
    try:
        return fn(*args), None
    except UsageError as err:
        return None, err
    except CheckpointError as err:
        return None, UsageError(str(err))
    except OSError as err:
        return None, UsageError(f"{err.filename or ''}: {err.strerror or err}")


def claim(cfg, grid):
    """Collective: probe every output place, then lock the checkpoint directory (rank 0).  Returns the
    lock's path on rank 0 (None elsewhere, or without a checkpoint directory)."""
    comm, root = grid.world_comm.mpi, grid.rank_id == 0
    places = [(f"--{flag}", Path(path).parent) for flag, path in
              (("metrics", cfg.metrics), ("trace", cfg.trace), ("summary-json", cfg.summary_json),
               ("export", cfg.export)) if path and root]
    ckpt = checkpoint_dir(cfg)
    if ckpt:
        places.append(("--save" if cfg.save else "--resume", Path(ckpt)))
    error = None
    for flag, place in places:
        reason = probe(place)
        if reason:
            error = UsageError(f"{flag}: cannot write to {place}: {reason}")
            break
    agree(comm, error)
    held, error = _attempt(lock.acquire, ckpt) if ckpt and root else (None, None)
    agree(comm, error)
    return held


def release(held):
    if held is not None:
        lock.release(held)


def _target(cfg):
    """Rank 0: (the run id to save under, or None) - refusing a directory that holds another run's steps."""
    target = checkpoint_dir(cfg)
    if not target:
        return None
    resumed = latest_checkpoint(cfg.resume) if cfg.resume else None
    if resumed is not None and Path(cfg.resume).resolve() == Path(target).resolve():
        return run_of(resumed) or uuid.uuid4().hex[:12]         # continue its run
    found = steps(target)
    held = latest_checkpoint(target) or (found[max(found)] if found else None)
    if held is not None:
        raise UsageError(f"--save {target} already holds {held.name} of another run: continue that run with "
                         f"--resume {target}, or save into another directory (nothing was written)")
    return run_of(resumed) if resumed is not None and run_of(resumed) else uuid.uuid4().hex[:12]


def run_id(cfg, grid):
    """Collective, before the checkpoint is loaded: the id this run saves its steps under (a resumed run's
    own), after refusing a --save into another run's directory."""
    comm = grid.world_comm.mpi
    found, error = _attempt(_target, cfg) if grid.rank_id == 0 else (None, None)
    agree(comm, error)
    return comm.bcast(found, root=0)
