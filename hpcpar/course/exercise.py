"""An exercise, the student's file, the verdict of its check, and its hints.

Four kinds of exercise:

* a function to write: ``check(f)`` calls it on cases whose answers the package's own code gives;
* a prediction (``name == "ANSWER"``): ``check(value)`` compares it with the measured answer, and only
  a passed check shows the command that measures it (``after``): the lessons never print it;
* a function that runs on MPI ranks (``ranks`` > 0): after ``check(f)`` (None, or a check in the calling
  process: the simulator, the function at many sizes), ``hpcpar course check`` starts ``mpiexec -n
  ranks`` (mpi_launch.py) and every rank runs ``mpi_check(f, world)`` on a real Communicator;
* a function plugged into the trainer (``plug``): its ``mpi_check`` runs ``hpcpar train --plug``'s hook
  on 2 to 4 ranks and compares the losses with one rank's (plugged.py).

The student's file runs with the exercise's reference out of reach (``hidden``, guard.py).  A failed
check says where the first difference is, never the whole answer; ``--hint`` reveals the exercise's
``hints`` one at a time, each remembered in the signed hint log (hints.py).
"""
import shutil
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from hpcpar.course import guard, mpi_launch
from hpcpar.course.wrong import Crashed, Wrong

HERE = Path(__file__).parent
TEMPLATES, SOLUTIONS = HERE / "templates", HERE / "solutions"
MPI_TIMEOUT_S = 60          # an MPI exercise that has not finished by then hangs: a deadlock


@dataclass(frozen=True)
class Exercise:
    number: int
    lesson: str         # docs/course/ page
    topic: str          # TP, PP, DP, 3D, checkpoints, tracing, CP, Llama, precision, hangs, memory, MoE,
                        # attention, measuring, documents, DeepSeek, reliability, optimizers
    title: str
    name: str           # the function to write, or "ANSWER"
    check: object       # check(value) raises Wrong (None: an MPI exercise checked on its ranks only)
    solution: object    # the reference: a function from the package, or () -> the measured answer
    hints: tuple = ()   # revealed one at a time by --hint: the first an idea, the last the method, no code
    after: str = ""     # printed once the check passes: how to measure a prediction, what to try next
    ranks: int = 0      # > 0: then the check runs under mpiexec -n ranks ...
    mpi_check: object = None    # ... as mpi_check(f, world) on every rank
    hidden: tuple = ()  # the modules that hold the answer: refused to the student's file (guard.py)
    plug: bool = False  # the function runs inside `hpcpar train --plug` (training/plug.py)

    @property
    def template(self):
        return TEMPLATES / self.filename()

    @property
    def solution_file(self):
        """The instructor key's answer, written as a student would (hpcpar course key)."""
        return SOLUTIONS / self.filename()

    def filename(self):
        return f"ex{self.number:02d}.py"


def start(exercise, directory):
    """Copy the blank file into ``directory`` (never over the student's work); returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / exercise.filename()
    if not target.exists():
        shutil.copyfile(exercise.template, target)
    return target


def load(exercise, path):
    """The student's file as a module, the exercise's reference hidden from it (guard.Hidden if it
    imports it)."""
    return guard.load(path, exercise.hidden, f"exercise {exercise.number}")


def reference(exercise):
    """A module-like object holding the reference solution under the exercise's name."""
    value = exercise.solution() if exercise.name == "ANSWER" else exercise.solution
    return SimpleNamespace(**{exercise.name: value})


def not_written(exercise, where):
    return f"exercise {exercise.number}: {exercise.name} is not written yet (it raises NotImplementedError): " \
           f"fill it in in {where}"


def crashed(exercise, err, where):
    """The message for an exception in the student's code, with the line of their file it came from."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == str(where)]
    line = f" (line {frames[-1].lineno} of {where})" if frames else ""
    return f"exercise {exercise.number}: {exercise.name} raised {type(err).__name__}: {err}{line}"


def check_file(exercise, path, timeout=MPI_TIMEOUT_S):
    """(passed, message) of the exercise's check on the student's file at ``path``."""
    try:
        module = load(exercise, path)
    except guard.Hidden as err:
        return False, f"exercise {exercise.number}: not yet - {err}"
    except Exception as err:                # the file itself does not run
        return False, crashed(exercise, err, path)
    return verdict(exercise, module, path, timeout)


def check_solution(exercise, timeout=MPI_TIMEOUT_S):
    """(passed, message) of the check on the package's reference (an MPI exercise: the key's answer,
    run with the same fence as a student's)."""
    if exercise.ranks:
        return check_file(exercise, exercise.solution_file, timeout)
    return verdict(exercise, reference(exercise), "the package's reference", timeout)


def verdict(exercise, module, where, timeout=MPI_TIMEOUT_S):
    """(passed, message) of the exercise's check on ``module`` (the student's file at ``where``, or
    ``reference(exercise)``)."""
    value = getattr(module, exercise.name, None)
    if value is None:
        what = "ANSWER is still None: write your prediction" if exercise.name == "ANSWER" else \
            f"there is no function {exercise.name}"
        return False, f"exercise {exercise.number}: {what} in {where}"
    try:
        if exercise.check is not None:
            exercise.check(value)
        if exercise.ranks:
            mpi_launch.launch(exercise, [str(where)], timeout)
    except NotImplementedError:
        return False, not_written(exercise, where)
    except Crashed as err:
        return False, str(err)
    except Wrong as err:
        return False, f"exercise {exercise.number}: not yet - {err}\n  (a hint, one step at a time: " \
                      f"hpcpar course check {exercise.number} --hint)"
    except Exception as err:          # the student's code crashed: show where, in their file
        return False, crashed(exercise, err, where)
    after = f"\n{exercise.after}" if exercise.after else ""
    return True, f"exercise {exercise.number}: passed - {exercise.title}{after}"
