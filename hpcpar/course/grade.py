"""Grading a class: ``hpcpar course grade DIR...`` (docs/course/teaching.md).

Each DIR is one student's work folder (its name is the student's).  Every exercise of every folder
is checked in a process of its own (``python -m hpcpar.course.grade EXERCISE FILE``), a session the
grader ends whole after ``timeout`` seconds (an MPI exercise's ranks included), so a hang, a crash or
an endless loop costs that one exercise only.  The result, one row per student: the points of each
exercise (``points`` for a pass, less ``hint_penalty`` a hint, never below 0), the hints used as the
signed log says (hints.py: verified, unsigned, tampered, none), the total, and the first failure's
message - written as CSV and JSON.
"""
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

from hpcpar.course import hints as hint_log

MARK = "course-grade:"


def grade_file(number, path, timeout):
    """(passed, message, seconds) of exercise ``number`` on the file ``path``, in a process of its own."""
    from hpcpar import launch
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "grade.log"
        cmd = [sys.executable, "-m", "hpcpar.course.grade", str(number), str(path), str(timeout)]
        status, _ = launch.run_job(cmd, log, timeout)
        lines = log.read_text(errors="replace").splitlines()
    seconds = time.monotonic() - start
    said = [json.loads(line[len(MARK):]) for line in lines if line.startswith(MARK)]
    if status is None:
        return False, f"exercise {number}: ended after {timeout:g} s (a hang, or far too slow)", seconds
    if not said:
        return False, f"exercise {number}: the check ended with status {status} and no verdict: " + \
            (lines[-1][:200] if lines else "(no output)"), seconds
    return said[-1]["passed"], said[-1]["message"], seconds


def grade(folders, exercises, timeout=120.0, key=None, mirror=None, points=1.0, hint_penalty=0.0, echo=None):
    """{student: its record} for every folder of ``folders``, every exercise of ``exercises``."""
    out = {}
    for folder in folders:
        folder = Path(folder)
        status, used = hint_log.verify(folder, key, mirror)
        record = {"folder": str(folder), "hints": status, "exercises": {}, "total": 0.0, "first_failure": ""}
        for e in exercises:
            path = folder / e.filename()
            if path.exists():
                passed, message, seconds = grade_file(e.number, path, timeout)
            else:
                passed, message, seconds = False, f"exercise {e.number}: no {e.filename()}", 0.0
            taken = used.get(e.number, 0)
            score = max(0.0, points - hint_penalty * taken) if passed else 0.0
            record["exercises"][e.number] = {"passed": passed, "points": score, "hints": taken,
                                             "seconds": round(seconds, 1), "message": message.split("\n")[0]}
            record["total"] += score
            if not passed and not record["first_failure"]:
                record["first_failure"] = message.split("\n")[0]
            if echo:
                echo(f"{folder.name}: {message.splitlines()[0]}")
        out[folder.name] = record
    return out


def write(results, exercises, csv_path=None, json_path=None):
    """The grades as CSV (one row a student: total, hint log, points and hints per exercise, the first
    failure) and as JSON (everything, messages included)."""
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1) + "\n")
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["student", "total", "hint_log"] +
                       [f"ex{e.number:02d}_{k}" for e in exercises for k in ("points", "hints")] + ["first_failure"])
            for student, r in results.items():
                w.writerow([student, f"{r['total']:g}", r["hints"]] +
                           [v for e in exercises for v in (f"{r['exercises'][e.number]['points']:g}",
                                                           r["exercises"][e.number]["hints"])] +
                           [r["first_failure"]])


def main(argv):
    """One exercise on one file, in this process: prints MARK and the verdict as JSON."""
    from hpcpar.course.catalog import BY_NUMBER
    from hpcpar.course.exercise import check_file
    number, path, timeout = int(argv[0]), argv[1], float(argv[2])
    passed, message = check_file(BY_NUMBER[number], path, timeout=max(5.0, timeout - 5.0))
    print(MARK + json.dumps({"passed": passed, "message": message}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
