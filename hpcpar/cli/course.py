"""Exercises with checked answers (docs/course/): copy a blank exercise file, fill it in, check it.

  hpcpar course list                      the lessons, their minutes, and their exercises in order
  hpcpar course start 2 5 6               copy exercises 2, 5 and 6 into course-work/ (never over your work)
  hpcpar course check 2                   run the reference tests against course-work/ex02.py
  hpcpar course check 2 --hint            the same, then the next hint (one more each time, logged)
  hpcpar course check 13                  an MPI exercise: the check starts mpiexec -n 4 itself
  hpcpar course check all --solution      the same tests against the package's own code

For the teacher (docs/course/teaching.md):

  hpcpar course keygen teacher.key        a key that signs the hint logs and opens the key
  hpcpar course grade class/* --key teacher.key --csv grades.csv --json grades.json
  hpcpar course key 13 15 --key teacher.key    the instructor key: answers and discussion
"""
HELP = "exercises with checked answers: list, start, check; for the teacher: grade, keygen, key"


def add_arguments(p):
    from hpcpar.course.exercise import MPI_TIMEOUT_S
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="the lessons and their exercises, in order")
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
    g = sub.add_parser("grade", help="grade students' work folders: points, hints, first failure (CSV, JSON)")
    g.add_argument("folders", nargs="+", metavar="DIR", help="one work folder per student (its name: the student)")
    g.add_argument("--exercises", default="all", help="exercise numbers, comma-separated, or all (default)")
    g.add_argument("--timeout", type=float, default=180.0, help="seconds an exercise may take (default 180)")
    g.add_argument("--key", default="", help="the teacher's key file: verifies the signed hint logs")
    g.add_argument("--hint-dir", default="", help="the teacher's copies of the hint logs (HPCPAR_COURSE_HINT_DIR)")
    g.add_argument("--points", type=float, default=1.0, help="points for a passed exercise (default 1)")
    g.add_argument("--hint-penalty", type=float, default=0.0, help="points off a passed exercise per hint used")
    g.add_argument("--csv", default="grades.csv", help="the table, one row per student (default grades.csv)")
    g.add_argument("--json", default="grades.json", help="everything, messages included (default grades.json)")
    k = sub.add_parser("keygen", help="write a new teacher's key file")
    k.add_argument("path", help="where to write it (refuses to overwrite)")
    s = sub.add_parser("key", help="the instructor key: answers and discussion (needs the teacher's key file)")
    s.add_argument("numbers", nargs="+", metavar="N", help="exercise numbers, or all")
    s.add_argument("--key", required=True, help="the teacher's key file (hpcpar course keygen)")


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


def _key(path):
    """The teacher's key from ``path`` ('' : HPCPAR_COURSE_KEY, or none), refused in one line if unreadable."""
    import os

    from hpcpar.course.hints import KEY_ENV, read_key
    from hpcpar.runtime import UsageError
    path = path or os.environ.get(KEY_ENV, "")
    try:
        return read_key(path)
    except (OSError, ValueError) as err:
        raise UsageError(f"course key: {err}") from None


def _list():
    from hpcpar.course.catalog import EXERCISES
    from hpcpar.course.lessons import LESSONS
    width = max(len(e.title) for e in EXERCISES)
    for lesson in LESSONS:
        print(f"lesson {lesson.number}: {lesson.title} (about {lesson.minutes} min), docs/course/{lesson.page}")
        for e in (e for e in EXERCISES if e.lesson == lesson.page):
            where = "trainer" if e.plug else f"mpiexec -n {e.ranks}" if e.ranks else ""
            print(f"  {e.number:>3}  {e.topic:<11} {e.title:<{width}}  {where}".rstrip())
    return 0


def _grade(args):
    from pathlib import Path

    from hpcpar.course import grade
    from hpcpar.runtime import UsageError
    words = "all" if args.exercises == "all" else args.exercises.replace(",", " ")
    chosen = _selected(words.split())
    missing = [f for f in args.folders if not Path(f).is_dir()]
    if missing:
        raise UsageError(f"course grade: {missing[0]} is not a folder")
    results = grade.grade(args.folders, chosen, args.timeout, _key(args.key), args.hint_dir or None,
                          args.points, args.hint_penalty, echo=print)
    grade.write(results, chosen, args.csv, args.json)
    for student, r in results.items():
        print(f"{student}: {r['total']:g} of {args.points * len(chosen):g} points, hints {r['hints']}")
    print(f"wrote {args.csv} and {args.json}")
    return 0


def run(args):
    from pathlib import Path

    from hpcpar.course import exercise as ex
    from hpcpar.course import hints
    from hpcpar.runtime import UsageError
    if args.action == "list":
        return _list()
    if args.action == "grade":
        return _grade(args)
    if args.action == "keygen":
        try:
            print(f"wrote {hints.make_key(args.path)}: keep it from the students; set HPCPAR_COURSE_KEY to it "
                  "where they run their checks, pass it to hpcpar course grade --key")
        except FileExistsError:
            raise UsageError(f"course keygen: {args.path} exists; a new key would orphan its signatures") from None
        return 0
    chosen = _selected(args.numbers)
    if args.action == "key":
        if _key(args.key) is None:
            raise UsageError("course key: --key names the teacher's key file")
        from hpcpar.course.key import key_text
        print(key_text(chosen))
        return 0
    folder = "" if args.dir == "course-work" else f" --dir {args.dir}"
    if args.action == "start":
        for e in chosen:
            print(f"exercise {e.number}: edit {ex.start(e, args.dir)}, then: {_command()} course check {e.number}{folder}")
        return 0
    failed = 0
    for e in chosen:
        if args.solution:
            ok, message = ex.check_solution(e, args.timeout)
        else:
            path = Path(args.dir) / e.filename()
            if not path.exists():
                raise UsageError(f"no {path}: run {_command()} course start {e.number}{folder} first")
            ok, message = ex.check_file(e, path, args.timeout)
        print(message)
        if args.hint:
            print(hints.next_hint(e, args.dir, _key("")))
        failed += not ok
    return 1 if failed else 0
