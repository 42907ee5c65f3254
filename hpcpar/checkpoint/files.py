"""Atomic files: write to a temporary name, flush to disk, rename.  A reader sees the old file or the
new one, never half of one - even if the job is killed mid-write or the disk fills up."""
import hashlib
import json
import os
from pathlib import Path

from hpcpar import faults

FORMAT = "hpcpar-checkpoint/1"


class CheckpointError(Exception):
    """A checkpoint that cannot be written or read; the message names the file and the problem."""


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, data, rank=0):
    """Write bytes to ``path`` atomically (tmp + fsync + rename + fsync of the directory)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        faults.check_write(path, rank)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"cannot write {path}: {err.strerror or err}") from None


def write_json(path, obj, rank=0):
    write_atomic(path, (json.dumps(obj, indent=1) + "\n").encode(), rank)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path} is unreadable: {err}") from None
