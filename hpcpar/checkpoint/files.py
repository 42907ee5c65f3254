"""Atomic files: write to a temporary name, flush to disk, rename.  A reader sees the old file or the
new one, never half of one - even if the job is killed mid-write or the disk fills up.  Also: swapping
two directories in one step (``exchange``), asking whether a directory can be written before a run
needs it (``probe``), and refusing numbers that are not finite (``finite``)."""
import ctypes
import errno
import hashlib
import json
import os
import socket
from pathlib import Path

import numpy as np

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


def exchange(a, b):
    """Swap the paths ``a`` and ``b`` atomically (Linux's renameat2 RENAME_EXCHANGE): True when done,
    False when the system or the file system cannot (the caller then renames twice)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def probe(directory):
    """Make ``directory`` and write (and remove) a file in it: None when that works, else the reason.
    A run asks before its first step rather than find out at its first save."""
    directory = Path(directory)
    test = directory / f".hpcpar-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(test, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        os.unlink(test)
    except FileExistsError:                    # mkdir of a path that is a file
        return "it is a file, not a directory"
    except OSError as err:
        return err.strerror or str(err)
    return None


def finite(name, array, source):
    """Refuse ``array`` unless every number in it is finite: NaN and inf are never saved nor loaded."""
    if array.dtype.kind in "fc" and not np.isfinite(array).all():
        raise CheckpointError(f"{source}: {name} holds NaN or inf")
