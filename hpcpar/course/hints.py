"""Hints, one at a time, and the log of the hints a student has seen, signed for the teacher.

Each ``hpcpar course check N --hint`` shows the next hint of exercise N and appends a line to
``.hints.log`` in the work folder: the exercise, the hint's number, the time, and an HMAC-SHA256 over
that line, the folder's name (the student) and the previous line's MAC - a chain.  The key is the
teacher's: a file made by ``hpcpar course keygen`` and named by ``HPCPAR_COURSE_KEY`` where students
run their checks (a class machine, a course container).  ``hpcpar course grade --key`` checks every
chain with it: a line edited, removed from the middle or copied from another student's log breaks the
chain, and the grade says "tampered" and from which line on.  Without a key the lines are written
unsigned and the grade says "unsigned".

What a chain cannot show is its own end cut off or the whole log deleted (that reads as fewer hints
or none): a teacher who needs that too sets ``HPCPAR_COURSE_HINT_DIR`` to a folder the students can
append to but not rewrite (a drop box, a shared drive), where every line is written a second time;
the grade then counts the longer of the two (docs/course/teaching.md).
"""
import hashlib
import hmac
import json
import os
import secrets
import time
from pathlib import Path

LOG = ".hints.log"
KEY_ENV, DIR_ENV = "HPCPAR_COURSE_KEY", "HPCPAR_COURSE_HINT_DIR"
HEADER = "hpcpar-course-key-1"


def make_key(path):
    """Write a new teacher's key to ``path`` (readable by its owner only); refuses to overwrite one."""
    path = Path(path)
    with open(path, "x") as f:
        f.write(f"{HEADER} {secrets.token_hex(32)}\n")
    path.chmod(0o600)
    return path


def read_key(path):
    """The key's bytes from a file written by make_key; None for no path; ValueError for another file."""
    if not path:
        return None
    words = Path(path).read_text().split()
    if len(words) != 2 or words[0] != HEADER:
        raise ValueError(f"{path} is not a course key (hpcpar course keygen writes one)")
    return bytes.fromhex(words[1])


def _mac(key, student, previous, line):
    text = json.dumps([student, previous, line], sort_keys=True).encode()
    return hmac.new(key, text, hashlib.sha256).hexdigest()


def _entries(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def record(directory, exercise, hint, key=None):
    """Append the line "exercise ``exercise``'s hint ``hint`` shown" to the folder's log (and to the
    teacher's folder, if one is set), signed with ``key`` when there is one."""
    directory = Path(directory)
    student = directory.resolve().name
    entries = _entries(directory / LOG)
    line = {"exercise": exercise, "hint": hint, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    previous = entries[-1].get("mac") if entries else ""
    line["mac"] = _mac(key, student, previous, {k: line[k] for k in ("exercise", "hint", "time")}) if key else None
    text = json.dumps(line) + "\n"
    with open(directory / LOG, "a") as f:
        f.write(text)
    mirror = os.environ.get(DIR_ENV)
    if mirror:
        with open(Path(mirror) / f"{student}.hints.log", "a") as f:
            f.write(text)


def seen(directory):
    """{exercise: hints shown} from the folder's log, as the student sees it (not verified)."""
    out = {}
    for e in _entries(Path(directory) / LOG):
        out[e["exercise"]] = max(out.get(e["exercise"], 0), e["hint"])
    return out


def verify(directory, key, mirror=None):
    """(status, {exercise: hints}) of a student's folder: status "verified", "unsigned" (no key, or
    lines written without one), "tampered at line N", or "none" (no hint taken).  ``mirror``: the
    teacher's folder of second copies; the longer log counts."""
    directory = Path(directory)
    student = directory.resolve().name
    logs = [directory / LOG] + ([Path(mirror) / f"{student}.hints.log"] if mirror else [])
    entries = max((_entries(p) for p in logs), key=len)
    if not entries:
        return "none", {}
    status, previous = "verified", ""
    for i, e in enumerate(entries, 1):
        if key is None or e.get("mac") is None:
            status = "unsigned"
            continue
        body = {k: e.get(k) for k in ("exercise", "hint", "time")}
        if not hmac.compare_digest(str(e["mac"]), _mac(key, student, previous, body)):
            status = f"tampered at line {i}"
            break
        previous = e["mac"]
    counts = {}
    for e in entries:
        counts[int(e["exercise"])] = max(counts.get(int(e["exercise"]), 0), int(e["hint"]))
    return status, counts


def next_hint(exercise, directory, key=None):
    """The next hint not yet shown for ``exercise``, as text; the showing is logged (``record``)."""
    if not exercise.hints:
        return f"exercise {exercise.number} has no hints: its lesson, docs/course/{exercise.lesson}, has the reading"
    Path(directory).mkdir(parents=True, exist_ok=True)
    k = min(seen(directory).get(exercise.number, 0) + 1, len(exercise.hints))
    record(directory, exercise.number, k, key)
    more = "" if k == len(exercise.hints) else " (--hint again for the next)"
    return f"hint {k} of {len(exercise.hints)}: {exercise.hints[k - 1]}{more}"
