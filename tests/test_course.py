"""The course's checkers: each one fails on its blank exercise file with a message that says what to do,
fails on a typical mistake with a message that says what is wrong, and passes on the reference."""
import shutil
import sys

import numpy as np
import pytest

from hpcpar.course import check_pp
from hpcpar.course.catalog import EXERCISES
from hpcpar.course.exercise import load, reference, verdict
from mpitools import run

TOPICS = {"TP", "PP", "DP", "3D", "checkpoints", "tracing"}


def test_at_least_ten_exercises_over_every_topic():
    assert len(EXERCISES) >= 10 and {e.topic for e in EXERCISES} == TOPICS
    assert [e.number for e in EXERCISES] == list(range(1, len(EXERCISES) + 1))


@pytest.mark.parametrize("exercise", EXERCISES, ids=[f"ex{e.number:02d}" for e in EXERCISES])
def test_blank_template_fails_and_the_reference_passes(exercise, tmp_path):
    path = tmp_path / exercise.filename()
    shutil.copyfile(exercise.template, path)
    ok, message = verdict(exercise, load(path), path)
    assert not ok
    assert f"exercise {exercise.number}" in message and str(path) in message
    assert ("NotImplementedError" in message) if exercise.name != "ANSWER" else ("ANSWER is still None" in message)
    ok, message = verdict(exercise, reference(exercise), "reference")
    assert ok, message


def _student(tmp_path, number, code):
    path = tmp_path / f"ex{number:02d}.py"
    path.write_text(code)
    exercise = EXERCISES[number - 1]
    return verdict(exercise, load(path), path)


MISTAKES = {   # exercise: (a typical wrong answer, words the message must hold)
    1: ("import numpy as np\ndef ring_allreduce(xs, send):\n    s = sum(xs)\n"
        "    for r in range(len(xs)):\n        send(r, 0, s)\n    return [s.copy() for _ in xs]\n",
        "a ring sends only to rank + 1"),
    2: ("def column_parallel_backward(x, w, dy):\n    x2, d2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])\n"
        "    return dy @ w.T, d2.T @ x2, d2.sum(axis=0)\n", "dw_part (its columns of x^T dy) has shape"),
    3: ("def row_parallel_forward(xs, ws, b):\n    t = sum(x @ w + b for x, w in zip(xs, ws))\n"
        "    return [t for _ in xs]\n", "the bias is added"),
    4: ("ANSWER = 5.0\n", "Measure: .venv/bin/mpiexec -n 2"),
    5: ("ANSWER = (16, 16)\n", "m + p - 1"),
    6: ("def one_f_one_b(stage, stages, m):\n    return [('F', i) for i in range(m)] + [('B', i) for i in range(m)]\n",
        "warm-up forwards"),
    7: ("def zero1_shard(size, dp, rank):\n    return rank, size\n", "do not cover every element"),
    8: ("def coords(rank, tp, pp, dp):\n    return rank % tp, (rank // tp) % dp, rank // (tp * dp)\n",
        "rank = tp_i + tp x (dp_i + dp x pp_i)"),
    9: ("ANSWER = 0\n", "--ranks-per-node 8"),
    10: ("def reshard(pieces, dim, new_parts):\n    return pieces\n", "parts along dim"),
    11: ("def bubble(spans):\n    return 0.0\n", "p x makespan"),
    12: ("def hidden_share(comm, compute):\n    c = sum(b - a for a, b in comm)\n"
         "    return sum(max(0, min(b, d) - max(a, e)) for a, b in comm for e, d in compute) / c\n", "count once"),
}


@pytest.mark.parametrize("number", sorted(MISTAKES))
def test_a_typical_mistake_gets_a_useful_message(number, tmp_path):
    code, words = MISTAKES[number]
    ok, message = _student(tmp_path, number, code)
    assert not ok and "not yet" in message, message
    assert words in message, message


def test_a_crash_in_the_students_code_names_its_line(tmp_path):
    ok, message = _student(tmp_path, 8, "def coords(rank, tp, pp, dp):\n    return 1 / 0\n")
    assert not ok and "ZeroDivisionError" in message and "line 2" in message


def test_the_1f1b_reference_keeps_at_most_p_in_flight():
    assert check_pp.one_f_one_b(0, 4, 8)[:5] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0)]
    assert check_pp.busy_of_total() == (16, 28)


def test_cli_start_then_check(tmp_path):
    hpcpar = [sys.executable, "-m", "hpcpar", "course"]
    proc, _ = run(hpcpar + ["start", "7", "--dir", str(tmp_path)], timeout=60)
    assert proc.returncode == 0 and "ex07.py" in proc.stdout
    proc, _ = run(hpcpar + ["check", "7", "--dir", str(tmp_path)], timeout=60)
    assert proc.returncode == 1 and "not written yet" in proc.stdout
    (tmp_path / "ex07.py").write_text("def zero1_shard(size, dp, rank):\n    k = size // dp\n"
                                      "    return rank * k, (rank + 1) * k\n")
    proc, _ = run(hpcpar + ["check", "7", "--dir", str(tmp_path)], timeout=60)
    assert proc.returncode == 0 and "passed" in proc.stdout
    proc, _ = run(hpcpar + ["check", "99"], timeout=60)
    assert proc.returncode == 2 and "no exercise" in proc.stderr
    proc, _ = run(hpcpar + ["check", "3", "--dir", str(tmp_path)], timeout=60)
    assert proc.returncode == 2 and "course start 3" in proc.stderr


def test_ring_allreduce_reference_matches_the_sum():
    from hpcpar.course.collectives import ring_allreduce
    xs = [np.arange(12.0) * (r + 1) for r in range(3)]
    sent = []
    out = ring_allreduce(xs, lambda s, d, c: sent.append((s, d)))
    assert all(np.array_equal(y, sum(xs)) for y in out) and len(sent) == 12
