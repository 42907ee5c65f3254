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
"""
import ctypes
import mmap
import os
import resource
import signal
import struct
import sys

from hpcpar import runtime
from hpcpar.watch import alarm
from hpcpar.comm import flight

# rank, world, tp, pp, dp, step (-1: not yet), micro-batch (-1: none), coordinates known (0/1), cp (-1: no axis)
PAGE = struct.Struct("9q")
FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_page = None


class Page:
    """A few integers in memory shared by the guard and its rank (an anonymous shared mapping)."""

    def __init__(self):
        self.mem = mmap.mmap(-1, PAGE.size)
        self.values = [runtime.launch_rank(), 0, 0, 0, 0, -1, -1, 0, -1]
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


def split(directory):
    """In a process started by an MPI launcher on Linux: fork. The child returns (and becomes the MPI
    rank); the parent guards it and exits with its status. Must run before mpi4py is imported."""
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
    os._exit(_guard(child, shared, str(directory)))


def _guard(child, shared, directory):
    def forward(signum, frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass
    for sig in FORWARDED:
        signal.signal(sig, forward)
    _, status = os.waitpid(child, 0)
    if not os.WIFSIGNALED(status):
        return os.waitstatus_to_exitcode(status)
    sig = os.WTERMSIG(status)
    report_death(shared.read(), child, f"was killed by signal {sig} ({signal.Signals(sig).name})", directory)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))      # the rank's crash, not the guard's: no core file
    if sig != signal.SIGKILL:                   # (whose handler cannot be changed: it is the default)
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)                   # die of the same signal: the launcher reports the same
    return 128 + sig


def report_death(values, pid, how, directory):
    """The one line, the dead rank's flight record, the alarm and the others' diagnosis."""
    from hpcpar.comm.grid import Coord
    from hpcpar.watch.why import where
    rank, world, tp, pp, dp, step, mb, known, cp = values
    coords = Coord(tp=tp, pp=pp, dp=dp, cp=None if cp < 0 else cp) if known else None
    record = {"rank": rank, "dead": how, "reason": None, "coords": coords and coords.as_dict(), "step": step,
              "mb": None if mb < 0 else mb, "action": None, "phase": "step", "pid": pid, "ops": []}
    place = f"({coords.words()})" if known else "(coordinates not yet known)"
    print(f"hpcpar: rank {rank} {place} {how} in {where(record)}", file=sys.stderr, flush=True)
    try:
        flight.write_record(directory, record)
        if alarm.claim(directory, f"guard of rank {rank}"):
            alarm.announce(directory, world or rank + 1)
    except OSError as err:
        print(f"hpcpar: no flight record for rank {rank}: {err}", file=sys.stderr, flush=True)
