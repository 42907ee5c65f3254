"""An exercise, the student's file, and the verdict of its check."""
import importlib.util
import shutil
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

TEMPLATES = Path(__file__).parent / "templates"


class Wrong(Exception):
    """A check that failed; the message says what is wrong and what to look at."""


@dataclass(frozen=True)
class Exercise:
    number: int
    lesson: str         # docs/course/ page
    topic: str          # TP, PP, DP, 3D, checkpoints, tracing
    title: str
    name: str           # the function to write, or "ANSWER"
    check: object       # check(value) raises Wrong
    solution: object    # the reference: a function from the package, or the measured answer

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


def verdict(exercise, module, where):
    """(passed, message) of the exercise's check on ``module``."""
    value = getattr(module, exercise.name, None)
    if value is None:
        what = "ANSWER is still None: write your prediction" if exercise.name == "ANSWER" else \
            f"there is no function {exercise.name}"
        return False, f"exercise {exercise.number}: {what} in {where}"
    try:
        exercise.check(value)
    except NotImplementedError:
        return False, f"exercise {exercise.number}: {exercise.name} is not written yet (it raises " \
                      f"NotImplementedError): fill it in in {where}"
    except Wrong as err:
        return False, f"exercise {exercise.number}: not yet - {err}"
    except Exception as err:          # the student's code crashed: show where, in their file
        frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == str(where)]
        line = f" (line {frames[-1].lineno} of {where})" if frames else ""
        return False, f"exercise {exercise.number}: {exercise.name} raised {type(err).__name__}: {err}{line}"
    return True, f"exercise {exercise.number}: passed - {exercise.title}"
