"""Process-level facts and failure policy, independent of MPI initialisation.

Two kinds of failure, two policies (docs/reliability.md):

* ``UsageError`` - a bad configuration.  It is detected from the command line alone, identically on
  every rank and *before any collective*, so every rank can simply exit with status 2.  Only rank 0
  prints the one-line message, so the user sees it once.
* anything else - a fault that may strike one rank while the others wait inside a collective.  That
  rank prints its message and calls ``MPI_Abort``, which ends the whole job at once; a plain
  ``sys.exit`` on one rank would leave the others blocked forever.  The message must leave the
  process before the abort does: see ``abort``.
"""
import array
import fcntl
import os
import stat
import sys
import termios
import time
import traceback

from hpcpar.launch import choose_threads

# Environment variables through which the common launchers tell a process its rank and world size.
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")

EXIT_USAGE = 2       # bad configuration or input
EXIT_FAILURE = 1     # a fault during the run (the job was aborted)
EXIT_PREEMPTED = 3   # stopped by a signal after writing a checkpoint: requeue me


_fault_hooks = []   # called with the exception before an unexpected fault ends the job (hpcpar/watch/watchdog.py)


def on_fault(hook):
    _fault_hooks.append(hook)


def remove_fault_hook(hook):
    _fault_hooks.remove(hook)


class UsageError(Exception):
    """A configuration the user must change; raised identically on every rank before any collective."""


class RunFault(Exception):
    """A fault at run time on some ranks (a full disk under --metrics), said in one sentence: it ends the
    job like any other (exit 1), its message printed without an exception's name."""


class AgreedError(Exception):
    """A failure every rank knows about (they agreed on it with ``agree``): all exit, none waits."""


def agree(comm, error=None):
    """Collective: if any rank of ``comm`` passes an exception, every rank raises AgreedError with the
    first one's message (naming its rank) - or UsageError, when that was one (bad input found by some
    ranks only: a file they read, a directory they cannot write). Used where a fault may hit some ranks
    only (a missing file on one node, a full disk) and the others would otherwise wait for them forever."""
    said = None if error is None else (isinstance(error, UsageError), f"{error} (rank {comm.rank})")
    failed = [m for m in comm.allgather(said) if m is not None]
    if failed:
        usage, message = failed[0]
        raise (UsageError if usage else AgreedError)(message)


def _rank_var():
    """The launcher's rank variable, if any. Slurm's SLURM_PROCID counts only inside a job step (srun):
    a batch script has it too (= 0) without being an MPI process."""
    for var in _RANK_VARS:
        if var in os.environ and (var != "SLURM_PROCID" or "SLURM_STEP_ID" in os.environ):
            return var
    return None


def launch_rank():
    """This process's rank as told by the launcher's environment (0 when not launched by MPI)."""
    var = _rank_var()
    return int(os.environ[var]) if var else 0


def launched_by_mpi():
    return _rank_var() is not None


def set_launch_defaults():
    """This process's BLAS/OpenMP threads (launch.choose_threads), and what processes started by
    mpiexec/srun need; a user's own setting always wins."""
    choose_threads(launched_by_mpi())
    if not launched_by_mpi():
        return
    # MPICH spins while it waits for a message.  With more ranks than cores the spinning ranks starve
    # the ones computing; the throttle inserts a usleep(1) after a run of empty polls (docs/mpi.md).
    os.environ.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")


def keep_freed_memory():
    """Ask glibc to keep freed memory for reuse instead of handing it back to the kernel.

    numpy allocates every activation anew. By default glibc serves blocks above 128 KiB with a fresh
    mmap and unmaps them when freed, so each step writes its activations into new pages and pays a
    page fault per 4 KiB - measured here as about a third of a small model's step. With a 32 MiB mmap
    threshold (glibc's maximum) and no trimming, freed blocks are reused warm. The price: the process
    keeps its peak heap. A user's own MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ wins.
    """
    mallopt = _glibc_mallopt()
    if mallopt is None or "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    mallopt(M_MMAP_THRESHOLD, 32 * 2**20)
    mallopt(M_TRIM_THRESHOLD, 2**30)


def _glibc_mallopt():
    """glibc's ``mallopt`` (the malloc tunables), or None off Linux or under another C library (musl, ...)."""
    if sys.platform != "linux":
        return None
    import ctypes
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def start_mpi():
    """Start MPI (mpi4py.MPI's import calls MPI_Init_thread) with glibc filling each new heap block with
    one byte meanwhile, and then no more.

    MPICH hands the launcher each rank's address card at start-up, the unused tail of its buffer
    included, hex-encoded with runs shortened.  That buffer comes from the heap, where a Python rank
    has freed its modules' bytecode before MPI starts: a tail of text encodes long, and under Slurm's
    pmi2 a put longer than its line is cut in two - the address arrives broken and MPI_Init fails
    ("mpi/pmi2: value not properly terminated", "UCX ERROR failed to unpack address").  A tail of
    zeros encodes to a few characters (a run of one hex digit; 0xA5... would not shorten).  glibc's
    M_PERTURB fills each new block with the complement of its byte: 0xFF gives zeros.  Elsewhere
    nothing is done.
    """
    import importlib
    mallopt = _glibc_mallopt()
    M_PERTURB = -6
    if mallopt:
        mallopt(M_PERTURB, 0xFF)
    try:
        importlib.import_module("mpi4py.MPI")
    finally:
        if mallopt:
            mallopt(M_PERTURB, 0)


def mpi_initialized():
    """True when mpi4py.MPI has been imported (which initialises MPI) and MPI is not yet finalised."""
    mod = sys.modules.get("mpi4py.MPI")
    return bool(mod and mod.Is_initialized() and not mod.Is_finalized())


# How long a failing rank waits for the launcher to take its last words before it aborts the job.
DRAIN_SECONDS = 10.0


def unread_bytes(fd):
    """Bytes written to ``fd`` that the process at the other end has not read yet (0 when unknowable:
    a terminal or a regular file holds nothing back)."""
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode):
            request = termios.FIONREAD          # on a pipe: bytes in the pipe, whichever end asks
        elif stat.S_ISSOCK(mode):
            request = termios.TIOCOUTQ          # on a socket: bytes sent but not yet taken by the peer
        else:
            return 0
        count = array.array("i", [0])
        fcntl.ioctl(fd, request, count, True)
        return count[0]
    except OSError:
        return 0


def wait_until_read(fds, seconds=DRAIN_SECONDS):
    """Wait (at most ``seconds``) until the launcher has read everything written to ``fds``."""
    deadline = time.monotonic() + seconds
    while any(unread_bytes(fd) for fd in fds) and time.monotonic() < deadline:
        time.sleep(0.005)


def say_last_words(line):
    """Write one line to stderr with a single unbuffered write (no Python buffer left to flush)."""
    sys.stderr.flush()
    data = (line + "\n").encode("utf-8", "replace")
    while data:
        data = data[os.write(2, data):]


def abort(code):
    """End every rank of the job now (only if MPI is running with more than one rank).

    Why the wait: the rank's stdout/stderr are pipes to the launcher's local agent (Hydra's proxy;
    slurmstepd under srun), while MPI_Abort reaches that agent on a separate socket.  On a loaded
    machine the agent can wake to find both waiting; Hydra's proxy then forwarded the abort first, and
    mpiexec, which kills the job and exits the moment an abort arrives, never printed the line (rc 1,
    empty stderr).  Once our pipe is empty the agent has taken the line and passed it on, ahead of
    an abort that is sent only afterwards.
    """
    if mpi_initialized():
        MPI = sys.modules["mpi4py.MPI"]     # whoever started MPI imported it; this module never does
        if MPI.COMM_WORLD.size > 1:
            sys.stdout.flush()
            sys.stderr.flush()
            wait_until_read((1, 2))
            MPI.COMM_WORLD.Abort(code)
    sys.exit(code)


def run_guarded(fn, *args, debug=False, who=None):
    """Run ``fn(*args)`` under the failure policy above and return its exit status.

    ``who`` is a callable giving a short label of this rank (e.g. its grid coordinates) for messages.
    """
    try:
        return fn(*args) or 0
    except (UsageError, AgreedError) as err:
        if debug:
            traceback.print_exc()
        if launch_rank() == 0:
            print(f"hpcpar: error: {err}", file=sys.stderr, flush=True)
        return EXIT_USAGE if isinstance(err, UsageError) else EXIT_FAILURE
    except BrokenPipeError:             # `hpcpar ... | head`: the reader left; not an error
        sys.stdout = open(os.devnull, "w")
        return 0
    except KeyboardInterrupt:
        say_last_words(f"hpcpar: interrupted on rank {launch_rank()}")
        abort(130)
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 - every other fault ends the whole job
        for hook in list(_fault_hooks):
            hook(err)
        label = who() if who else f"rank {launch_rank()}"
        if debug:
            traceback.print_exc()
        hint = "" if debug or isinstance(err, RunFault) else " (--debug shows the traceback)"
        say_last_words(f"hpcpar: error on {label}: {describe(err)}{hint}")
        abort(EXIT_FAILURE)


def describe(err):
    """A fault in one sentence: a RunFault's own, a file's name and the system's reason for an OSError
    about a file, else the exception's name and message."""
    if isinstance(err, RunFault):
        return str(err)
    if isinstance(err, OSError) and err.filename:
        return f"{err.filename}: {err.strerror or err}"
    return f"{type(err).__name__}: {err}"
