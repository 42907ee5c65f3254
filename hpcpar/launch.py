"""Starting other processes: the MPI launcher, one BLAS thread each, a job run and ended as a whole.

``hpcpar bench``, ``hpcpar scaling`` and ``hpcpar plan calibrate`` start their measurements as fresh
processes (often ``mpiexec -n N`` jobs) and read back what they wrote.  What those three share is here:

    THREAD_VARS      the BLAS/OpenMP thread counts: one thread per rank unless a user says otherwise
                     (runtime.set_launch_defaults for processes started by mpiexec/srun)
    mpiexec()        $HPCPAR_MPIEXEC (the Makefile sets it), else the mpiexec next to this Python
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


def single_thread_env():
    """{variable: "1"} for every thread count: one core against one core, ranks that do not compete."""
    return {var: "1" for var in THREAD_VARS}


def mpiexec():
    """The MPI launcher as a list of words."""
    words = shlex.split(os.environ.get("HPCPAR_MPIEXEC") or str(Path(sys.executable).parent / "mpiexec"))
    if os.sep in words[0]:                   # a relative path (the Makefile's .venv/bin/mpiexec) must
        words[0] = os.path.abspath(words[0])  # still work from a job's own working directory
    return words


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
