"""What every rank of an MPI exercise runs (mpi_launch.py starts the job and reads the verdicts).

    python -m hpcpar.course.mpi_rank NUMBER PATH [PATH ...]     the files to check, one after another

Every rank builds a Communicator over MPI.COMM_WORLD, loads the file with the exercise's reference
hidden (guard.py) and runs the exercise's ``mpi_check(f, world)`` (an exercise plugged into the trainer
gets the whole file: its functions go in together): the student's code communicates,
then the ranks agree on one verdict per stage (on_ranks.py), so that a rank that finds a difference
never leaves another waiting.  Rank 0 prints one line per file, ``MARK i: verdict``.  A rank whose code
raises prints why and aborts the job; a job that does not end within the timeout is ended whole
(hpcpar.launch.run_job) and reported as a deadlock.
"""
import sys

from mpi4py import MPI

from hpcpar.comm import Communicator
from hpcpar.course.catalog import BY_NUMBER
from hpcpar.course.exercise import crashed, load
from hpcpar.course.mpi_launch import MARK
from hpcpar.course.on_ranks import Agreed
from hpcpar.course.wrong import Wrong


def run_one(exercise, path, world, index):
    """This rank's verdict on one file: "passed", "not-written", or what is wrong."""
    try:
        module = load(exercise, path)
        exercise.mpi_check(module if exercise.plug else getattr(module, exercise.name), world)
        return "passed"
    except NotImplementedError:
        return "not-written"
    except Agreed as err:                   # every rank has the same
        return str(err)
    except Wrong as err:
        return f"rank {world.rank}: {err}"
    except Exception as err:                # the others may wait for this rank forever: end the job
        print(f"\n{MARK} {index}: crashed {crashed(exercise, err, path)} on rank {world.rank}", flush=True)
        world.mpi.Abort(1)


def main(argv):
    exercise = BY_NUMBER[int(argv[0])]
    world = Communicator(MPI.COMM_WORLD, "world")
    for i, path in enumerate(argv[1:]):
        said = run_one(exercise, path, world, i)
        verdicts = world.mpi.gather(said, root=0)      # a few words per rank: the pickled gather is fine
        if world.rank == 0:
            failed = [v for v in verdicts if v != "passed"]
            print(f"{MARK} {i}: {failed[0] if failed else 'passed'}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
