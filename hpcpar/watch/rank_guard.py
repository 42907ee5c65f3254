"""The rank guard: a small parent process per rank that names the rank if it dies.

A rank killed by a signal (the OOM killer's SIGKILL, a segfault, a SIGKILL from an operator) cannot say
anything, and the launcher that notices the lost process knows only its process id.  MPICH's hydra
prints "BAD TERMINATION ... PID 12345 ... EXIT CODE: 9" and kills the others within a second; other
ranks may print MPI error stacks about a peer they can no longer read from.  Nothing names the rank.

So ``hpcpar train`` under a launcher forks before MPI starts: the child is the MPI rank, and the
parent - the process the launcher started - only waits for it, forwarding the signals it gets
(SIGTERM, SIGUSR1, ...).  The moment the child dies of a signal the parent knows the signal
(``waitpid``), and it reads the child's coordinates and last step from a page of shared memory the
child updates at each pipeline action (a few integers: below a microsecond).  It prints one line
before the launcher hears of the death, writes the dead rank's flight record, raises the alarm so
that the others write theirs (hpcpar/watch/alarm.py), prints the diagnosis, and only then exits with the
child's signal - so the launcher's own report, and any error stack, come after.

The child asks the kernel to kill it if the parent dies (``PR_SET_PDEATHSIG``): a launcher that
kills the parents ends the ranks too.

With ``--on-failure shrink`` the others go on without the dead rank (training/recovery.py): the guard
says the one line, leaves the rank's record (the time of its death among it) and dies at once, without
the alarm and the diagnosis - the launcher's report of the death is what the survivors wait for.  It
also looks, ten times a second, for an order to kill its rank (alarm.exclude: a rank that stalled).
"""
import ctypes
import mmap
import os
import resource
import signal
import struct
import sys
import time

from hpcpar import runtime
from hpcpar.watch import alarm
from hpcpar.comm import flight

# rank, world, tp, pp, dp, step (-1: not yet), micro-batch (-1: none), coordinates known (0/1), cp (-1: no axis),
# leaving (0/1: the run is over, the exit status that follows is the job's)
PAGE = struct.Struct("10q")
FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_page = None


class Page:
    """A few integers in memory shared by the guard and its rank (an anonymous shared mapping)."""

    def __init__(self):
        self.mem = mmap.mmap(-1, PAGE.size)
        self.values = [runtime.launch_rank(), 0, 0, 0, 0, -1, -1, 0, -1, 0]
        self._write()

    def _write(self):
        PAGE.pack_into(self.mem, 0, *self.values)

    def read(self):
        return PAGE.unpack_from(self.mem, 0)

    def set_coords(self, rank, world, coords):
        self.values[:5] = [rank, world, coords.tp, coords.pp, coords.dp]
        self.values[7] = 1
        self.values[8] = -1 if coords.cp is None else coords.cp
        self._write()

    def set_progress(self, step, mb):
        self.values[5], self.values[6] = step, -1 if mb is None else mb
        self._write()


def page():
    """The shared page of this rank, or None when no guard watches it."""
    return _page


def leaving():
    """The run is over: the exit status that follows is the job's answer, not a death."""
    if _page is not None:
        _page.values[9] = 1
        _page._write()


def split(directory, shrink=False):
    """In a process started by an MPI launcher on Linux: fork. The child returns (and becomes the MPI
    rank); the parent guards it and exits with its status. Must run before mpi4py is imported.
    ``shrink``: the job goes on without a rank that dies (--on-failure shrink)."""
    global _page
    if not runtime.launched_by_mpi() or not sys.platform.startswith("linux") or "mpi4py.MPI" in sys.modules:
        return
    shared = Page()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
        if os.getppid() != parent:                                      # the guard died already
            os._exit(1)
        _page = shared
        return
    os._exit(_guard(child, shared, str(directory), shrink))


def _guard(child, shared, directory, shrink=False):
    def forward(signum, frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass
    for sig in FORWARDED:
        signal.signal(sig, forward)
    status = _wait_excluding(child, directory) if shrink else os.waitpid(child, 0)[1]
    if not os.WIFSIGNALED(status):
        code = os.waitstatus_to_exitcode(status)
        if shrink and code and not shared.read()[9]:
            # a rank that exits mid-run: a recoverable job's runtime ends nobody for it, and tells nobody
            # either (Open MPI 5 reports deaths by signal, not exit statuses) - so the guard dies by one
            report_death(shared.read(), child, f"exited with status {code}", directory, shrink)
            os.kill(os.getpid(), signal.SIGKILL)
        return code
    sig = os.WTERMSIG(status)
    report_death(shared.read(), child, f"was killed by signal {sig} ({signal.Signals(sig).name})", directory, shrink)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))      # the rank's crash, not the guard's: no core file
    if sig != signal.SIGKILL:                   # (whose handler cannot be changed: it is the default)
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)                   # die of the same signal: the launcher reports the same
    return 128 + sig


def _wait_excluding(child, directory):
    """waitpid(child), killing the child first if the others order it (alarm.exclude)."""
    me = runtime.launch_rank()
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            return status
        if me in alarm.excluded(directory):
            os.kill(child, signal.SIGKILL)
            return os.waitpid(child, 0)[1]
        time.sleep(0.1)


def report_death(values, pid, how, directory, shrink=False):
    """The one line, the dead rank's flight record, the alarm and the others' diagnosis (with ``shrink``:
    the line and the record; the others go on)."""
    from hpcpar.comm.grid import Coord
    from hpcpar.watch.why import where
    rank, world, tp, pp, dp, step, mb, known, cp, _ = values
    coords = Coord(tp=tp, pp=pp, dp=dp, cp=None if cp < 0 else cp) if known else None
    record = {"rank": rank, "dead": how, "reason": None, "coords": coords and coords.as_dict(), "step": step,
              "mb": None if mb < 0 else mb, "action": None, "phase": "step", "pid": pid, "ops": [],
              "time": round(time.time(), 6)}
    place = f"({coords.words()})" if known else "(coordinates not yet known)"
    then = "; the others go on without it (--on-failure shrink)" if shrink else ""
    print(f"hpcpar: rank {rank} {place} {how} in {where(record)}{then}", file=sys.stderr, flush=True)
    try:
        flight.write_record(directory, record)
        if not shrink and alarm.claim(directory, f"guard of rank {rank}"):
            alarm.announce(directory, world or rank + 1)
    except OSError as err:
        print(f"hpcpar: no flight record for rank {rank}: {err}", file=sys.stderr, flush=True)
