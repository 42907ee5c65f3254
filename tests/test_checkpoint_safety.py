"""Nothing lost, ever (docs/checkpoints.md, "What is never deleted"): the ways an adversarial user lost
checkpoints, each run as `hpcpar` would run it - the command line's main() in this process, on one rank
and on four (tp 2 x dp 2) - asserting its one line, its exit status, and that every step saved before
is still there, unchanged and loadable:

  a --save into a directory holding another run's later steps (its rotation deleted the new step);
  a resume with another model (layers, tied head, heads) or optimizer;
  a run whose update overflowed (its "last good step" was saved poisoned), a --min-lr of NaN;
  a second run in a locked directory, and the lock of a run that is gone (taken over);
  a save killed between the two renames of a step written again (the reader recovers, the next save
  repairs);
  `checkpoint convert` into a run's directory or onto itself.
"""
import hashlib
import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from hpcpar.checkpoint import latest_checkpoint
from hpcpar.checkpoint.convert import open_checkpoint
from mpitools import in_process

TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8", "--batch-size", "4", "--no-progress",
        "--hang-timeout", "0", "--shutdown-timeout", "0"]


@pytest.fixture
def no_gemm_rate(monkeypatch):
    """The summary's GEMM rate is measured for 0.3 s a run: not needed here."""
    monkeypatch.setattr("hpcpar.training.loop.Loop.measure_gemm_rate", lambda self: 1e12)


class Hpcpar:
    """`hpcpar ARGS` through the command line's main(), on every rank of ``comm`` at once."""

    def __init__(self, comm, capfd, layout):
        self.comm, self.capfd, self.layout = comm, capfd, layout

    def __call__(self, *args, train=True):
        status, err = in_process(self.capfd, ["train", *TINY, *self.layout, *args] if train else args)
        self.comm.Barrier()
        assert "Traceback" not in err, err
        return status, err

    def refused(self, status_wanted, *args, train=True):
        """The one error line of a refused command (rank 0 says it, every rank gets it), its status asserted."""
        status, err = self(*args, train=train)
        assert status == status_wanted, err
        lines = [ln for ln in err.splitlines() if ln.startswith("hpcpar: error")]
        return collective(self.comm, lambda: (len(lines) == 1 or pytest.fail(err)) and lines[0])


def collective(comm, check):
    """``check()`` on rank 0, its result (or its failure) on every rank: a failing assertion on rank 0
    alone would leave the others waiting for it in the next collective."""
    result, failure = None, None
    if comm.rank == 0:
        try:
            result = check()
        except BaseException as err:        # noqa: BLE001 - handed to every rank
            failure = f"{type(err).__name__}: {err}"
    result, failure = comm.bcast((result, failure), root=0)
    if failure:
        pytest.fail(f"on rank 0: {failure}")
    return result


def files(root):
    """{path under root: SHA-256} of every step and ``latest`` (not the flight records nor the lock)."""
    root = Path(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and (p.name == "latest" or p.parts[len(root.parts)].startswith("step-"))}


def loadable(root, steps):
    """Every tensor of each step in ``steps`` reads back (checksums, finite numbers); ``latest`` names the
    last."""
    for n in steps:
        reader = open_checkpoint(Path(root) / f"step-{n:08d}")
        assert reader.manifest["step"] == n
        for name in reader.names():
            reader.full(name)
            for state in reader.manifest["optimizer"]["states"]:
                reader.full(f"optimizer/{state}/{name}")
    assert latest_checkpoint(root).name == f"step-{steps[-1]:08d}"


def kept(comm, root, before, steps):
    """Nothing deleted or altered since ``before``, and every step of ``steps`` loadable (rank 0 looks)."""
    def check():
        assert files(root) == before
        loadable(root, steps)
    collective(comm, check)


def scenarios(comm, tmp, run):
    ck, root = tmp / "ck", comm.rank == 0
    status, err = run("--save", ck, "--save-every", 1, "--steps", 6)
    assert status == 0, err
    before = collective(comm, lambda: files(ck))
    kept(comm, ck, before, [4, 5, 6])

    # another run's --save into the directory: refused, not rotated into
    line = run.refused(2, "--save", ck, "--steps", 2)
    assert line.startswith(f"hpcpar: error: --save {ck} already holds step-00000006 of another run: continue "
                           f"that run with --resume {ck}"), line
    kept(comm, ck, before, [4, 5, 6])

    # a resume with another model or optimizer: one line naming both values
    where = f"{ck}/step-00000006"
    for flags, said in ((["--layers", 1, "--keep", 1], "holds another model: layers = 2 there, 1 in this run (--layers)"),
                        (["--untied"], "holds another model: tied = True there, False in this run (--untied)"),
                        (["--heads", 4], "holds another model: heads = 2 there, 4 in this run (--heads)"),
                        (["--optimizer", "sgd"], "was written with --optimizer adamw; this run has --optimizer sgd")):
        line = run.refused(2, "--resume", ck, "--steps", 8, *flags)
        assert line.startswith(f"hpcpar: error: {where} {said}"), line
        kept(comm, ck, before, [4, 5, 6])

    # an update that overflows: the poisoned step is never saved; a NaN --min-lr never starts
    line = run.refused(1, "--resume", ck, "--steps", 10, "--save-every", 1, "--lr", 1e308)
    assert line.startswith(f"hpcpar: error: not saving step 7 to {ck}: its weights are not finite"), line
    kept(comm, ck, before, [4, 5, 6])
    line = run.refused(2, "--resume", ck, "--steps", 10, "--keep", 1, "--min-lr", "nan")
    assert "argument --min-lr: must be a finite number, not 'nan'" in line
    kept(comm, ck, before, [4, 5, 6])

    # a second writer is refused while the first holds the lock; a lock whose process is gone is taken over
    holder = subprocess.Popen(["sleep", "60"]) if root else None
    pid = collective(comm, lambda: lock(ck, holder.pid))
    line = run.refused(2, "--resume", ck, "--steps", 7)
    assert line.startswith(f"hpcpar: error: {ck} is in use by another run (pid {pid} on {socket.gethostname()}")
    kept(comm, ck, before, [4, 5, 6])
    if root:
        holder.kill()
        holder.wait()                            # its pid is gone now: the lock is stale
    status, err = run("--resume", ck, "--steps", 7, "--keep", 10)
    assert status == 0, err
    assert collective(comm, lambda: not (ck / "lock").exists())

    # killed between the two renames of a step written again: step-7 moved aside, its new copy complete
    def interrupted():
        (ck / "step-00000007").rename(ck / "step-00000007.old")
        shutil.copytree(ck / "step-00000007.old", ck / "step-00000007.partial")
        return latest_checkpoint(ck).name
    assert collective(comm, interrupted) == "step-00000007.partial"
    status, err = run("--resume", ck, "--steps", 8, "--keep", 10)
    assert status == 0, err
    assert collective(comm, lambda: sorted(p.name for p in ck.glob("step-*"))) == \
        [f"step-0000000{n}" for n in (4, 5, 6, 7, 8)]
    before = collective(comm, lambda: files(ck))
    kept(comm, ck, before, [4, 5, 6, 7, 8])

    # convert onto itself or into a run's directory: refused, nothing written (one rank: it needs no MPI)
    def convert_refused():
        for src in (ck, ck / "step-00000008"):
            line = Hpcpar(_Self(), run.capfd, ()).refused(2, "checkpoint", "convert", src, ck, train=False)
            assert line == f"hpcpar: error: {ck} holds a checkpoint already: convert into a new directory " \
                           f"(nothing was written)", line
    collective(comm, convert_refused)
    kept(comm, ck, before, [4, 5, 6, 7, 8])


def lock(ck, pid):
    """A lock of ``ck`` held by process ``pid`` of this host (as a run takes it: checkpoint/lock.py)."""
    (ck / "lock").write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "job": None, "since": "now"}))
    return pid


class _Self:
    """A communicator of this rank alone, for a command that needs no MPI."""
    rank = 0

    def Barrier(self):
        pass

    def bcast(self, obj, root=0):
        return obj


def test_nothing_is_lost_on_one_rank(tmp_path, capfd, no_gemm_rate):
    from mpi4py import MPI
    scenarios(MPI.COMM_WORLD, tmp_path, Hpcpar(MPI.COMM_WORLD, capfd, ()))


@pytest.mark.mpi(min_size=4)
def test_nothing_is_lost_on_four_ranks(comm, tmp_path_factory, capfd, no_gemm_rate):
    if comm.size != 4:
        pytest.skip("tp 2 x dp 2")
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("safety")) if comm.rank == 0 else None, root=0))
    scenarios(comm, tmp, Hpcpar(comm, capfd, ("--tp", 2, "--dp", 2)))
