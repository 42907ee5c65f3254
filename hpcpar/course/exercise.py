"""An exercise, the student's file, the verdict of its check, and its hints.

Three kinds of exercise:

* a function to write: ``check(f)`` calls it on cases whose answers the package's own code gives;
* a prediction (``name == "ANSWER"``): ``check(value)`` compares it with the measured answer, and only
  a passed check shows the command that measures it (``after``): the lessons never print it;
* a function that runs on MPI ranks (``ranks`` > 0): ``hpcpar course check`` starts ``mpiexec -n ranks``
  (hpcpar/course/mpi_run.py) and every rank runs ``check(f, comm)`` on a real Communicator; a
  ``precheck(f)`` (the simulator, say) runs first, in the calling process.

A failed check says where the first difference is, never the whole answer; ``--hint`` reveals the
exercise's ``hints`` one at a time.
"""
import importlib.util
import json
import shutil
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from hpcpar.course import mpi_launch
from hpcpar.course.wrong import Crashed, Wrong

TEMPLATES = Path(__file__).parent / "templates"
MPI_TIMEOUT_S = 60          # an MPI exercise that has not finished by then hangs: a deadlock


@dataclass(frozen=True)
class Exercise:
    number: int
    lesson: str         # docs/course/ page
    topic: str          # TP, PP, DP, 3D, checkpoints, tracing, CP, Llama, precision, hangs, memory, MoE,
                        # attention
    title: str
    name: str           # the function to write, or "ANSWER"
    check: object       # check(value) raises Wrong; MPI exercises: check(f, comm) on every rank
    solution: object    # the reference: a function from the package, or () -> the measured answer
    hints: tuple = ()   # revealed one at a time by --hint
    after: str = ""     # printed once the check passes: how to measure a prediction, what to try next
    ranks: int = 0      # > 0: the check runs under mpiexec -n ranks
    precheck: object = None     # MPI exercises: a check in the calling process before the launch

    @property
    def template(self):
        return TEMPLATES / f"ex{self.number:02d}.py"

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


def load(path):
    """The student's file as a module."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def verdict(exercise, module, where, timeout=MPI_TIMEOUT_S):
    """(passed, message) of the exercise's check on ``module`` (the student's file at ``where``, or
    ``reference(exercise)``)."""
    value = getattr(module, exercise.name, None)
    if value is None:
        what = "ANSWER is still None: write your prediction" if exercise.name == "ANSWER" else \
            f"there is no function {exercise.name}"
        return False, f"exercise {exercise.number}: {what} in {where}"
    try:
        if exercise.ranks:
            if exercise.precheck is not None:
                exercise.precheck(value)
            mpi_launch.launch(exercise, getattr(module, "__file__", None), timeout)
        else:
            exercise.check(value)
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


def next_hint(exercise, directory):
    """The next hint not yet shown for ``exercise`` (remembered in ``directory``/.hints.json), as text."""
    if not exercise.hints:
        return f"exercise {exercise.number} has no hints: its lesson, docs/course/{exercise.lesson}, has the reading"
    seen_file = Path(directory) / ".hints.json"
    seen = json.loads(seen_file.read_text()) if seen_file.exists() else {}
    shown = seen.get(str(exercise.number), 0)
    k = min(shown + 1, len(exercise.hints))
    seen[str(exercise.number)] = k
    Path(directory).mkdir(parents=True, exist_ok=True)
    seen_file.write_text(json.dumps(seen))
    more = "" if k == len(exercise.hints) else " (--hint again for the next)"
    return f"hint {k} of {len(exercise.hints)}: {exercise.hints[k - 1]}{more}"
