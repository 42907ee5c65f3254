"""What every rank of an MPI exercise runs (mpi_launch.py starts the job and reads the verdict).

    python -m hpcpar.course.mpi_rank NUMBER PATH      the student's file (or "-": the package's reference)

Every rank builds a Communicator over MPI.COMM_WORLD, loads the function and runs the exercise's
``check(f, comm)``: the student's code communicates, then each rank compares what it holds with what
the reference computation says (the checks do all their own communication before any comparison, so
a rank that finds a difference never leaves another waiting).  Rank 0 gathers the verdicts and prints
one line that starts with MARK; mpi_launch.launch reads it from the job's log.  A rank whose code raises
prints why and aborts the job; a job that does not end within the timeout is ended whole
(hpcpar.launch.run_job) and reported as a deadlock.
"""
import sys

from mpi4py import MPI

from hpcpar.comm import Communicator
from hpcpar.course.catalog import BY_NUMBER
from hpcpar.course.exercise import crashed, load, reference
from hpcpar.course.mpi_launch import MARK
from hpcpar.course.wrong import Wrong


def _load(number, path):
    exercise = BY_NUMBER[number]
    module = reference(exercise) if path == "-" else load(path)
    return exercise, getattr(module, exercise.name)


def main(argv):
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
