"""The collective save protocol.  Every step that can fail is followed by ``agree``: if any rank
failed, every rank raises the same error and the previous checkpoint stays as it was.

 0. every rank checks that the numbers it would write are finite: a poisoned step is never saved
 1. rank 0 finishes a publish an earlier save left half done, and creates DIR/step-N.partial
 2. every writing rank writes its file there atomically and computes its SHA-256
 3. rank 0 writes manifest.json, puts step-N.partial in place as step-N, then replaces ``latest``
    (directory.publish: a step written again is swapped in atomically)
 4. rank 0 deletes this run's steps beyond the newest ``keep`` (directory.rotate; never the new one)
Only after step 3 does the new checkpoint exist for a reader, and it exists whole.
"""
import shutil
from pathlib import Path

from safetensors.numpy import save as safetensors_bytes

from hpcpar.checkpoint.directory import publish, repair, rotate, step_name
from hpcpar.checkpoint.files import FORMAT, CheckpointError, finite, fsync_dir, sha256, write_atomic, write_json
from hpcpar.checkpoint.manifest import manifest
from hpcpar.checkpoint.pieces import rank_tensors
from hpcpar.runtime import agree


def _attempt(fn):
    """Run fn; return None or the exception it raised (to be agreed on)."""
    try:
        fn()
        return None
    except (OSError, CheckpointError) as err:
        return err


def save_checkpoint(trainer, directory, step, keep=3, run=None):
    """Collective: write the state after ``step`` completed steps to DIR/step-<step>.  ``run``: the id of
    the run saving (rotation deletes only its steps); ``keep`` 0: delete nothing (the stop path)."""
    tensors, layout = rank_tensors(trainer)
    mine = {f"rank-{trainer.grid.rank_id:05d}.safetensors": (tensors, layout)} if tensors else {}
    return write_checkpoint(trainer, trainer.grid.world_comm.mpi, directory, step, keep, mine, run)


def write_checkpoint(meta, comm, directory, step, keep, mine, run=None):
    """Collective over ``comm``: the protocol above, for this rank's files ``mine`` {file name: (tensors,
    layout)} (several when it writes pieces kept in memory, checkpoint/memory.py).  ``meta``: the Trainer,
    or anything with its cfg, mcfg, optimizer and scaler, for the manifest."""
    rank = comm.rank
    root = Path(directory)
    partial = root / (step_name(step) + ".partial")

    def check():
        for tensors, _ in mine.values():
            for name, array in tensors.items():
                finite(name, array, f"not saving step {step} to {root}: its weights are not finite (a checkpoint "
                                    f"of them would poison every resume; the steps saved before stay)")
    agree(comm, _attempt(check))

    def prepare():
        root.mkdir(parents=True, exist_ok=True)
        repair(root)
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

    def put_in_place():
        written = [entry for files, _ in everyone for entry in files]
        names = max((s for _, s in everyone), key=len)
        write_json(partial / "manifest.json", manifest(meta, step, [(f, lay) for f, _, lay in written],
                                                       {f: i for f, i, _ in written}, names, run))
        fsync_dir(partial)
        publish(root, partial, step)
        if keep:
            rotate(root, run, keep, step)
    agree(comm, _attempt(put_in_place) if rank == 0 else None)
    return root / step_name(step)
