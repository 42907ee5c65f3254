"""Fault injection, for the reliability tests (docs/reliability.md): make one rank fail on purpose.

    HPCPAR_FAULT="step:3@2"      rank 2 raises RuntimeError at the start of step 3
    HPCPAR_FAULT="write@1"       rank 1's next checkpoint file write fails with ENOSPC (a full disk)

and the process-level deaths --on-failure shrink goes on after (training/recovery.py), named by the rank
the launcher gave the process (a survivor's rank changes when the world shrinks; this number does not):

    HPCPAR_FAULT="kill:3@2"      launch rank 2 sends itself SIGKILL at the start of step 3
    HPCPAR_FAULT="exit:3@2"      ... exits with status 1 there, without a word (os._exit)
    HPCPAR_FAULT="stall:3@2"     ... stops itself there (SIGSTOP): alive, silent, for the watchdog to find
    HPCPAR_FAULT="kill:save@2"   ... SIGKILL in the middle of its next checkpoint save
    HPCPAR_FAULT="kill:recover@2"  ... SIGKILL in the middle of the next recovery (a second failure)

Several faults: separated by commas ("kill:3@2,kill:recover@5").  Unset (always, outside tests), every
check is one dictionary lookup.
"""
import errno
import os
import signal

from hpcpar.runtime import launch_rank


def _faults():
    """[(what, rank)] of HPCPAR_FAULT."""
    spec = os.environ.get("HPCPAR_FAULT", "")
    return [(what, int(rank)) for what, _, rank in (f.rpartition("@") for f in spec.split(",")) if what]


def check_step(step, rank):
    for what, who in _faults():
        if what == f"step:{step}" and who == rank:
            raise RuntimeError(f"injected fault at step {step} (HPCPAR_FAULT={os.environ['HPCPAR_FAULT']})")
    check_death(step)


def check_death(point):
    """A kill, exit or stall of this process at ``point`` (a step number, "save" or "recover")."""
    for what, who in _faults():
        how, _, at = what.partition(":")
        if at == str(point) and who == launch_rank() and how in ("kill", "exit", "stall"):
            if how == "exit":
                os._exit(1)
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)


def check_write(path, rank):
    check_death("save")
    for what, who in _faults():
        if what == "write" and who == rank:
            raise OSError(errno.ENOSPC, "No space left on device (injected by HPCPAR_FAULT)", str(path))
