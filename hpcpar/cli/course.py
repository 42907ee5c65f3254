"""Exercises with checked answers (docs/course/): copy a blank exercise file, fill it in, check it.

  hpcpar course list                      the exercises, in the order of the lessons
  hpcpar course start 2 5 6               copy exercises 2, 5 and 6 into course-work/ (never over your work)
  hpcpar course check 2                   run the reference tests against course-work/ex02.py
  hpcpar course check 2 --hint            the same, then the next hint (one more each time)
  hpcpar course check 13                  an MPI exercise: the check starts mpiexec -n 4 itself
  hpcpar course check all --solution      the same tests against the package's own code
"""
HELP = "exercises with checked answers: list, start, check"


def add_arguments(p):
    from hpcpar.course.exercise import MPI_TIMEOUT_S
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="the exercises, in the order of the lessons")
    for name, text in (("start", "copy blank exercise files into the work folder"),
                       ("check", "check exercise files against the references")):
        s = sub.add_parser(name, help=text)
        s.add_argument("numbers", nargs="+", metavar="N", help="exercise numbers, or all")
        s.add_argument("--dir", default="course-work", help="the work folder (default course-work)")
        if name == "check":
            s.add_argument("--solution", action="store_true",
                           help="check the reference solution instead (what passing looks like)")
            s.add_argument("--hint", action="store_true",
                           help="after the check, show the next hint of the exercise (one more each time)")
            s.add_argument("--timeout", type=float, default=MPI_TIMEOUT_S,
                           help=f"seconds an MPI exercise may run before it counts as hung (default {MPI_TIMEOUT_S})")


def _selected(words):
    from hpcpar.course.catalog import BY_NUMBER, EXERCISES
    from hpcpar.runtime import UsageError
    if words == ["all"]:
        return EXERCISES
    for text in words:
        if not text.isdigit() or int(text) not in BY_NUMBER:
            raise UsageError(f"no exercise {text!r}: choose among 1-{len(EXERCISES)}, or all (hpcpar course list)")
    return [BY_NUMBER[int(text)] for text in dict.fromkeys(words)]


def _command():
    """How to call hpcpar from wherever the student is: the script beside this Python, else python -m."""
    import shlex
    import sys
    from pathlib import Path
    script = Path(sys.executable).parent / "hpcpar"
    return shlex.quote(str(script)) if script.exists() else f"{shlex.quote(sys.executable)} -m hpcpar"


def run(args):
    from pathlib import Path

    from hpcpar.course import exercise as ex
    from hpcpar.course.catalog import EXERCISES
    from hpcpar.runtime import UsageError
    if args.action == "list":
        width = max(len(e.title) for e in EXERCISES)
        for e in sorted(EXERCISES, key=lambda e: (e.lesson, e.number)):       # in the order of the lessons
            mpi = f"mpiexec -n {e.ranks}" if e.ranks else ""
            print(f"{e.number:>3}  {e.topic:<11} {e.title:<{width}}  {mpi:<12} docs/course/{e.lesson}")
        return 0
    chosen = _selected(args.numbers)
    folder = "" if args.dir == "course-work" else f" --dir {args.dir}"
    if args.action == "start":
        for e in chosen:
            print(f"exercise {e.number}: edit {ex.start(e, args.dir)}, then: {_command()} course check {e.number}{folder}")
        return 0
    failed = 0
    for e in chosen:
        if args.solution:
            ok, message = ex.verdict(e, ex.reference(e), "the package's reference", args.timeout)
        else:
            path = Path(args.dir) / e.filename()
            if not path.exists():
                raise UsageError(f"no {path}: run {_command()} course start {e.number}{folder} first")
            ok, message = ex.verdict(e, ex.load(path), path, args.timeout)
        print(message)
        if args.hint:
            print(ex.next_hint(e, args.dir))
        failed += not ok
    return 1 if failed else 0
