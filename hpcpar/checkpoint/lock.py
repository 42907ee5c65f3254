"""The lock of a checkpoint directory: one run writes there at a time.

Two runs saving into one directory destroy each other's work: one's rotation deletes the other's
newest step, or both write ``latest.tmp`` at once.  So a run that saves takes ``DIR/lock`` before its
first step - created with O_EXCL, exactly one creator succeeds - holding the host, process id and
Slurm job of the run's rank 0, and removes it when it ends.  A second run is refused in one line that
names the holder.

A run that was killed (SIGKILL, MPI_Abort, a node lost) leaves its lock behind.  It is recognised as
stale, and taken over, when its process is gone from this host, or when it belongs to this same Slurm
job (a requeued job, or a script's earlier attempt: a job's steps run one after another).  A lock of
another host and job cannot be judged from here: the message says which file to remove.
"""
import json
import os
import socket
import time
from pathlib import Path

from hpcpar.runtime import UsageError

LOCK = "lock"


def _me():
    return {"host": socket.gethostname(), "pid": os.getpid(), "job": os.environ.get("SLURM_JOB_ID"),
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:             # someone else's process: alive
        return True
    return True


def _read(path):
    try:
        held = json.loads(Path(path).read_text())
        ok = isinstance(held, dict) and isinstance(held.get("pid"), int) and isinstance(held.get("host"), str)
        return held if ok else None
    except (OSError, ValueError):
        return None


def stale(held, me):
    """Is the lock ``held`` left by a run that is over (or by this process: one run at a time in it)?"""
    if held["host"] == me["host"] and (held["pid"] == me["pid"] or not _alive(held["pid"])):
        return True
    return held.get("job") is not None and held.get("job") == me["job"]


def acquire(directory):
    """Take the lock of ``directory`` (which exists) for this process; returns its path.  UsageError, one
    line naming the holder, when another run holds it."""
    path = Path(directory) / LOCK
    me = _me()
    for _ in range(3):                              # a stale lock removed, then taken by a third run: refused
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            held = _read(path)
            if held is None and not path.exists():  # released meanwhile: try again
                continue
            if held is None:
                raise UsageError(f"{path} exists but says no run (a run killed while taking it?): remove it "
                                 f"if no run writes to {directory}") from None
            if not stale(held, me):
                job = f", Slurm job {held['job']}" if held.get("job") else ""
                raise UsageError(f"{directory} is in use by another run (pid {held['pid']} on {held['host']}{job}, "
                                 f"since {held.get('since', '?')}): two runs in one checkpoint directory delete "
                                 f"each other's steps; wait for it to end, or remove {path} if it is gone") from None
            _take_over(path, held, me)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return path
    raise UsageError(f"{directory}: another run took its lock at the same time; start one run at a time")


def _take_over(path, held, me):
    """Move the stale lock ``held`` out of the way.  Two runs may judge it stale at once: the one whose
    rename finds a fresh lock instead (the other's, made meanwhile) puts that one back."""
    grave = path.with_name(f"{LOCK}.{me['host']}.{me['pid']}.stale")
    try:
        os.rename(path, grave)
    except FileNotFoundError:                   # the other run moved it first
        return
    if _read(grave) != held:
        try:
            os.link(grave, path)
        except FileExistsError:
            pass
    grave.unlink(missing_ok=True)


def release(path):
    """Remove the lock if this process holds it."""
    held = _read(path)
    if held is not None and held["pid"] == os.getpid() and held["host"] == socket.gethostname():
        Path(path).unlink(missing_ok=True)
