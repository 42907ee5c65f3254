"""Fault injection, for the reliability tests (docs/reliability.md): make one rank fail on purpose.

    HPCPAR_FAULT="step:3@2"      rank 2 raises RuntimeError at the start of step 3
    HPCPAR_FAULT="write@1"       rank 1's next checkpoint file write fails with ENOSPC (a full disk)

Unset (always, outside tests), every check is one dictionary lookup.
"""
import errno
import os


def _fault():
    spec = os.environ.get("HPCPAR_FAULT", "")
    if "@" not in spec:
        return None, None
    what, rank = spec.rsplit("@", 1)
    return what, int(rank)


def check_step(step, rank):
    what, who = _fault()
    if what == f"step:{step}" and who == rank:
        raise RuntimeError(f"injected fault at step {step} (HPCPAR_FAULT={os.environ['HPCPAR_FAULT']})")


def check_write(path, rank):
    what, who = _fault()
    if what == "write" and who == rank:
        raise OSError(errno.ENOSPC, "No space left on device (injected by HPCPAR_FAULT)", str(path))
