"""Finding, verifying and loading checkpoints, into any layout.

``CheckpointReader`` assembles full tensors from the pieces any layout wrote, checking each file's
SHA-256 against the manifest the first time it is opened (a missing, truncated or altered file is
named in the error).  ``load_checkpoint`` is collective: each rank reads what it needs, and if any
rank fails, every rank raises the same error (``agree``).
"""
from pathlib import Path

from safetensors import SafetensorError, safe_open

from hpcpar.checkpoint.directory import resolve
from hpcpar.checkpoint.files import CheckpointError, finite, read_json, sha256
from hpcpar.checkpoint.manifest import check_manifest, check_resume
from hpcpar.checkpoint.pieces import apply
from hpcpar.nn.parameter import Shard
from hpcpar.runtime import UsageError, agree


def latest_checkpoint(directory):
    """The newest complete step directory under ``directory`` (per ``latest``, recovering from a publish
    that was interrupted: directory.resolve), or None if none yet."""
    return resolve(directory)


class CheckpointReader:
    def __init__(self, step_dir):
        self.dir = Path(step_dir)
        self.manifest = read_json(self.dir / "manifest.json")
        check_manifest(self.manifest, self.dir)
        self._open = {}

    def _file(self, name):
        if name not in self._open:
            path = self.dir / name
            want = self.manifest["files"].get(name)
            if not path.is_file():
                raise CheckpointError(f"{path} is missing")
            if want is None:
                raise CheckpointError(f"{path} is not listed in the manifest")
            size = path.stat().st_size
            if size != want["bytes"]:
                raise CheckpointError(f"{path} is truncated or altered: {size} bytes, the manifest says "
                                      f"{want['bytes']}")
            if sha256(path) != want["sha256"]:
                raise CheckpointError(f"{path}: checksum mismatch (the file was altered or corrupted)")
            try:
                self._open[name] = safe_open(str(path), framework="np")
            except (SafetensorError, OSError) as err:
                raise CheckpointError(f"{path} is unreadable: {err}") from None
        return self._open[name]

    def names(self):
        return list(self.manifest["tensors"])

    def full(self, key):
        """The full tensor ``key`` ("h.0.ln_1.weight", "optimizer/exp_avg/wte.weight", ...)."""
        base = key.rsplit("/", 1)[-1]
        entry = self.manifest["tensors"].get(base)
        if entry is None:
            raise CheckpointError(f"{self.dir}: no tensor {base!r} in this checkpoint")
        try:
            parts = [self._file(entry["files"][str(i)]).get_tensor(key) for i in range(entry.get("parts", 1))]
        except (KeyError, SafetensorError) as err:
            raise CheckpointError(f"{self.dir}: {key} is not where its manifest says ({err})") from None
        for part in parts:
            finite(key, part, str(self.dir))
        if "parts" not in entry:
            return parts[0]
        shard = Shard(entry["dim"], entry["parts"], 0, entry["groups"])
        return shard.assemble(parts, tuple(entry["shape"]))


def load_checkpoint(trainer, directory):
    """Collective. Load the latest complete checkpoint under ``directory`` into ``trainer`` (any layout).
    Returns the number of completed steps it holds, or None when there is no checkpoint yet.  A
    checkpoint of another model or optimizer is refused (manifest.py: check_resume)."""
    comm = trainer.grid.world_comm.mpi
    names = {n for names in comm.allgather([p.name for p in trainer.parameters()]) for n in names}
    step_dir, error = None, None
    try:
        step_dir = latest_checkpoint(directory)
    except CheckpointError as err:
        error = err
    agree(comm, error)
    if step_dir is None:
        return None
    try:
        reader = CheckpointReader(step_dir)
        check_resume(reader.manifest, step_dir, trainer, names)
        apply(trainer, reader.full, reader.manifest["optimizer"]["states"])
        trainer.optimizer.t = reader.manifest["optimizer"]["t"]
        scaler, saved = trainer.scaler, reader.manifest.get("loss_scale")
        if scaler.dynamic and saved and saved["scale"] != 1.0:      # fp16 resumes its loss scale
            scaler.scale, scaler.good_steps = saved["scale"], saved["good_steps"]
    except (CheckpointError, UsageError, KeyError) as err:
        error = err if not isinstance(err, KeyError) else CheckpointError(f"{step_dir}: manifest lacks {err}")
    agree(comm, error)
    return reader.manifest["step"]
