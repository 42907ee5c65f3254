"""The instructor key: ``hpcpar course key [N ...] --key FILE`` (the teacher's key file, hints.py).

For each exercise, an answer as a student would write it - the file in solutions/ that the tests hold
to passing its check, or for a prediction the measured value - and for each lesson of those
exercises, the answers to its discussion questions (lessons.py).  The key file is the switch that
keeps it from students who merely explore the commands; the answers are no secret from one who reads
the package's source, which holds the checks' references too.
"""
from hpcpar.course.lessons import BY_PAGE


def answer_text(exercise):
    """The exercise's answer: its solution file, or ``ANSWER = <the measured value>``."""
    if exercise.name == "ANSWER":
        return f"ANSWER = {exercise.solution()!r}\n"
    return exercise.solution_file.read_text()


def key_text(exercises):
    """The key of ``exercises``: each one's answer, then its lesson's discussion, once per lesson."""
    out, lessons = [], []
    for e in exercises:
        out.append(f"=== exercise {e.number}: {e.title} (docs/course/{e.lesson})\n{answer_text(e)}")
        if e.lesson not in lessons:
            lessons.append(e.lesson)
    for page in lessons:
        for question, answer in BY_PAGE[page].discuss:
            out.append(f"=== discussion, docs/course/{page}\nQ: {question}\nA: {answer}\n")
    return "\n".join(out)
