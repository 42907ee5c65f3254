"""The alarm: how ranks that can no longer talk through MPI agree to write their flight records.

When a job hangs, every healthy rank is blocked inside an MPI call that waits for the broken one, and
MPI offers no way to interrupt it.  So the ranks talk through the file system instead, in the flight
directory (``<run dir>/flight``):

1. the first rank to notice - its watchdog's deadline passed, or the guard of a rank that died -
   writes its record and creates ``ALARM`` (``O_CREAT | O_EXCL``: exactly one rank succeeds and leads);
2. every other rank's watchdog thread, while its own rank makes no progress, looks for ``ALARM`` twice
   a second (one ``stat``; never while the rank is busy) and writes its own record when it appears;
3. the leader waits until every rank has a record or no new one has come for a second (at most a few
   seconds: a stopped rank never answers), prints the diagnosis (hpcpar/watch/why.py) and ends the job.
"""
import os
import sys
import time
from pathlib import Path

ALARM = "ALARM"


def raised(directory):
    return os.path.exists(os.path.join(directory, ALARM))


def claim(directory, who):
    """Create the alarm; True for the one caller that created it (the leader)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(os.path.join(directory, ALARM), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.write(fd, f"{who}\n".encode())
    os.close(fd)
    return True


def await_records(directory, world, quiet=1.0, limit=5.0):
    """Wait until ``world`` records exist, or none has been added for ``quiet`` seconds (or ``limit``)."""
    start = last_change = time.monotonic()
    seen = -1
    while time.monotonic() - start < limit:
        count = len(list(Path(directory).glob("rank-*.json")))
        if count >= world:
            return
        if count != seen:
            seen, last_change = count, time.monotonic()
        elif time.monotonic() - last_change >= quiet:
            return
        time.sleep(0.1)


def announce(directory, world):
    """The leader's last lines: wait for the others' records, then print who waited for whom."""
    from hpcpar.watch.why import explain
    await_records(directory, world)
    try:
        text = explain(directory)
    except (OSError, ValueError, KeyError, TypeError) as err:   # a half-broken file system or record: still end
        text = f"no diagnosis ({err})"
    print(f"hpcpar: {text}\nhpcpar: flight records in {directory} (hpcpar trace why {directory})",
          file=sys.stderr, flush=True)


# --- --on-failure shrink: a rank the others go on without --------------------------------------------
#
# A rank that stalls is alive to MPI: the survivors could not shrink it away.  So the leader names it in
# <flight dir>.exclude - "<job> <launch rank>" lines, the job's PMIx namespace telling this job's lines
# from an old run's - and the rank's guard (rank_guard.py), which polls that file, kills it.  Its death
# then reaches the survivors as any other (training/recovery.py).  The recovery names every rank it
# left out there too: one the failure detector declared dead may still run, and must not.

def exclude_file(directory):
    return str(directory).rstrip("/") + ".exclude"


def job_id():
    return os.environ.get("PMIX_NAMESPACE", "")


def exclude(directory, launch_ranks):
    """Order the guards of ``launch_ranks`` to kill their ranks."""
    Path(directory).parent.mkdir(parents=True, exist_ok=True)
    with open(exclude_file(directory), "a") as f:
        f.write("".join(f"{job_id()} {r}\n" for r in launch_ranks))


def excluded(directory):
    """The launch ranks this job's guards are told to kill."""
    try:
        lines = Path(exclude_file(directory)).read_text().split("\n")
    except OSError:
        return set()
    return {int(r) for job, _, r in (line.partition(" ") for line in lines) if r and job == job_id()}
