"""Exercises with checked answers (docs/course/): copy a blank exercise file, fill it in, check it.

  hpcpar course list                      the exercises, by lesson
  hpcpar course start 2                   copy exercise 2's file into course-work/ (never over your work)
  hpcpar course check 2                   run the reference tests against course-work/ex02.py
  hpcpar course check all --solution      the same tests against the package's own code
"""
HELP = "exercises with checked answers: list, start, check"


def add_arguments(p):
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="the exercises, by lesson")
    for name, text in (("start", "copy blank exercise files into the work folder"),
                       ("check", "check exercise files against the references")):
        s = sub.add_parser(name, help=text)
        s.add_argument("number", help="an exercise number, or all")
        s.add_argument("--dir", default="course-work", help="the work folder (default course-work)")
        if name == "check":
            s.add_argument("--solution", action="store_true",
                           help="check the reference solution instead (what passing looks like)")


def _selected(text):
    from hpcpar.course.catalog import BY_NUMBER, EXERCISES
    from hpcpar.runtime import UsageError
    if text == "all":
        return EXERCISES
    if not text.isdigit() or int(text) not in BY_NUMBER:
        raise UsageError(f"no exercise {text!r}: choose 1-{len(EXERCISES)} or all (hpcpar course list)")
    return [BY_NUMBER[int(text)]]


def run(args):
    from pathlib import Path

    from hpcpar.course import exercise as ex
    from hpcpar.course.catalog import EXERCISES
    from hpcpar.runtime import UsageError
    if args.action == "list":
        for e in EXERCISES:
            print(f"{e.number:>3}  {e.topic:<12} {e.title:<80} docs/course/{e.lesson}")
        return 0
    chosen = _selected(args.number)
    if args.action == "start":
        for e in chosen:
            print(f"exercise {e.number}: edit {ex.start(e, args.dir)}, then: .venv/bin/hpcpar course check {e.number}")
        return 0
    failed = 0
    for e in chosen:
        if args.solution:
            ok, message = ex.verdict(e, ex.reference(e), "the package's reference")
        else:
            path = Path(args.dir) / e.filename()
            if not path.exists():
                raise UsageError(f"no {path}: run .venv/bin/hpcpar course start {e.number} first")
            ok, message = ex.verdict(e, ex.load(path), path)
        print(message)
        failed += not ok
    return 1 if failed else 0
