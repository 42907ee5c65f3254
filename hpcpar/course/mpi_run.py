"""The exercises that run on MPI ranks: ``launch`` starts the job, ``main`` is what every rank runs.

    python -m hpcpar.course.mpi_run NUMBER PATH      the student's file (or "-": the package's reference)

Every rank builds a Communicator over MPI.COMM_WORLD, loads the function and runs the exercise's
``check(f, comm)``: the student's code communicates, then each rank compares what it holds with what
the reference computation says (the checks do all their own communication before any comparison, so
a rank that finds a difference never leaves another waiting).  Rank 0 gathers the verdicts and prints
one line that starts with MARK; ``launch`` reads it from the job's log.  A rank whose code raises
prints why and aborts the job; a job that does not end within the timeout is ended whole
(hpcpar.launch.run_job) and reported as a deadlock.
"""
import sys
import tempfile
from pathlib import Path

from hpcpar.course.exercise import Crashed, Wrong

MARK = "course-verdict:"


def launch(exercise, path, timeout):
    """Run ``exercise``'s check on ``exercise.ranks`` ranks; raise Wrong unless every rank passed."""
    from hpcpar import launch as launcher
    cmd = launcher.mpiexec() + ["-n", str(exercise.ranks), sys.executable, "-m", "hpcpar.course.mpi_run",
                                str(exercise.number), str(path) if path else "-"]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "job.log"
        status, seconds = launcher.run_job(cmd, log, timeout)
        lines = log.read_text(errors="replace").splitlines()
    said = [line[len(MARK):].strip() for line in lines if line.startswith(MARK)]
    if status is None:
        raise Wrong(f"the {exercise.ranks} ranks did not finish in {timeout} s: a deadlock - some rank waits "
                    "in a call whose partner is never made (a blocking send both ways, a receive nobody "
                    "sends, a collective one rank skips)" + (f"; before that: {said[0]}" if said else ""))
    if said and said[0] == "passed":
        return
    if said and said[0].startswith("not-written"):
        raise NotImplementedError
    if said and said[0].startswith("crashed "):
        raise Crashed(said[0][len("crashed "):])
    if said:
        raise Wrong(said[0])
    raise Wrong(f"the job ended with status {status} without a verdict: {lines[-1] if lines else '(no output)'}")


def _load(number, path):
    from hpcpar.course.catalog import BY_NUMBER
    from hpcpar.course.exercise import load, reference
    exercise = BY_NUMBER[number]
    module = reference(exercise) if path == "-" else load(path)
    return exercise, getattr(module, exercise.name)


def main(argv):
    from mpi4py import MPI

    from hpcpar.comm import Communicator
    from hpcpar.course.exercise import crashed
    exercise, f = _load(int(argv[0]), argv[1])
    world = MPI.COMM_WORLD
    comm = Communicator(world, "world")
    try:
        exercise.check(f, comm)
        said = "passed"
    except NotImplementedError:
        said = "not-written"
    except Wrong as err:
        said = f"rank {comm.rank}: {err}"
    except Exception as err:                # the others may wait for this rank forever: end the job
        print(f"{MARK} crashed {crashed(exercise, err, argv[1])} on rank {comm.rank}", flush=True)
        world.Abort(1)
    verdicts = world.gather(said, root=0)   # a few words per rank, once: the pickled gather is fine here
    if comm.rank == 0:
        failed = [v for v in verdicts if v != "passed"]
        print(f"{MARK} {failed[0] if failed else 'passed'}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
