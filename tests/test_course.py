"""The course's checkers grade the work: for every exercise the blank file fails with a message that says
what to do, the reference (and the key's answer) passes, each known wrong-but-plausible answer
(tests/course_wrong.py, at least four per exercise) fails with a "not yet" that points at a difference
without giving the answer away, and an import of the reference is refused.  The MPI exercises and
those plugged into the trainer run under mpiexec - the key's answer, the blank file and every wrong
answer of one exercise in one job.  Then the hint log, the grading harness, the instructor key and the
lessons: every reference resolves, no lesson prints its prediction's answer or sends the student to
the code that answers its exercise before the check passes, no hint is code."""
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from course_wrong import BLOCKS_RIGHT, GOOD, HANG, MEASURED, QK_NORM, QK_NORM_DX, RIGHT33, WRONG, _blocks, _program
from hpcpar.cli import main
from hpcpar.course import check_hangs, check_measure, check_pp, guard, hints, mpi_launch
from hpcpar.course.catalog import BY_NUMBER, EXERCISES
from hpcpar.course.exercise import check_file, check_solution
from hpcpar.course.lessons import LESSONS
from mpitools import run

DOCS = Path(__file__).resolve().parent.parent / "docs"
COURSE = DOCS / "course"
IN_PROCESS = [e for e in EXERCISES if e.check is not None]          # checked here first (then on ranks)
ON_RANKS = [e for e in EXERCISES if e.ranks]


@pytest.fixture(autouse=True)
def canned_measurement(monkeypatch, request):
    """Exercise 33's check measures two training runs; the fast tests give it MEASURED instead."""
    if request.node.name != "test_the_measurement_exercise_on_this_machine":
        monkeypatch.setattr(check_measure, "measure", lambda: MEASURED)


def _file(tmp_path, number, code):
    path = tmp_path / f"ex{number:02d}.py"
    path.write_text(code)
    return path


def _verdict(tmp_path, number, code, timeout=60):
    return check_file(BY_NUMBER[number], _file(tmp_path, number, code), timeout)


def test_the_catalog_follows_the_rules():
    numbers = [e.number for e in EXERCISES]
    assert numbers == list(range(1, len(EXERCISES) + 1))            # numbered in the order they joined
    assert [lesson.number for lesson in LESSONS] == list(range(1, len(LESSONS) + 1))
    pages = sorted(p.name for p in COURSE.glob("[0-9][0-9]-*.md"))
    assert pages == [lesson.page for lesson in LESSONS]             # no gaps, no page without its entry
    assert {e.lesson for e in EXERCISES} <= set(pages)
    for e in EXERCISES:
        assert len(WRONG[e.number]) >= 4 and len(e.hints) >= 3 and e.template.exists(), e.number
        assert e.name == "ANSWER" or e.solution_file.exists(), e.number
        assert e.ranks in (0, 2, 4) and (e.mpi_check is not None) == bool(e.ranks), e.number
    plugged = [e for e in EXERCISES if e.plug]
    assert len(plugged) >= 4 and {e.topic for e in plugged} >= {"TP", "PP", "DP", "CP", "MoE"}
    assert any(e.topic == "measuring" for e in EXERCISES)


@pytest.mark.parametrize("exercise", IN_PROCESS, ids=lambda e: f"ex{e.number:02d}")
def test_blank_template_fails_and_the_reference_passes(exercise, tmp_path):
    path = tmp_path / exercise.filename()
    shutil.copyfile(exercise.template, path)
    ok, message = check_file(exercise, path)
    assert not ok and f"exercise {exercise.number}" in message
    if exercise.name == "ANSWER":
        assert "ANSWER is still None" in message and str(path) in message
    elif exercise.number == 14:                   # given as the code that hangs
        assert "not yet" in message, message
    else:
        assert "NotImplementedError" in message and str(path) in message
    if not exercise.ranks:                        # an MPI exercise's answer runs on ranks, below
        ok, message = check_solution(exercise)
        assert ok, message
        if exercise.name != "ANSWER":
            ok, message = check_file(exercise, exercise.solution_file)
            assert ok, message


CASES = [(e.number, i) for e in IN_PROCESS for i in range(len(WRONG[e.number]))]


@pytest.mark.parametrize("number,i", CASES, ids=[f"ex{n:02d}-{i}" for n, i in CASES])
def test_every_known_wrong_answer_fails(number, i, tmp_path):
    ok, message = _verdict(tmp_path, number, WRONG[number][i], timeout=20)
    assert not ok and "not yet" in message, message
    exercise = BY_NUMBER[number]
    if exercise.name == "ANSWER" and number != 33:      # a failed prediction never prints the measured answer
        answer = exercise.solution()
        numbers = answer if isinstance(answer, tuple) else (answer,)
        flat = [n for v in numbers for n in (v if isinstance(v, tuple) else (v,))]
        shown = message.split(" - ", 1)[1]
        assert not any(re.search(rf"(?<![\d.]){re.escape(f'{n:g}')}(?![\d.])", shown) for n in flat
                       if f"{n:g}" not in exercise.title + WRONG[number][i]), message
        assert exercise.after.split()[0] not in shown


@pytest.mark.parametrize("exercise", ON_RANKS, ids=lambda e: f"ex{e.number:02d}")
def test_on_mpi_ranks_the_answer_passes_and_the_blank_and_wrong_answers_fail(exercise, tmp_path):
    # one job: the key's answer, then (for an exercise checked on its ranks only) the blank file and every
    # wrong answer; a plugged exercise's answer trains the model at every layout of its check
    paths = [exercise.solution_file]
    if exercise.check is None:
        paths.append(shutil.copyfile(exercise.template, tmp_path / exercise.filename()))
        for i, code in enumerate(WRONG[exercise.number]):
            (tmp_path / str(i)).mkdir()
            paths.append(_file(tmp_path / str(i), exercise.number, code))
    said = mpi_launch.verdicts(exercise, paths, timeout=240)
    assert said[0] is None, said[0]
    for path, err in zip(paths[1:], said[1:]):
        assert err is not None, path.read_text()
        assert path.name.startswith("ex") and path.parent == tmp_path or not isinstance(err, NotImplementedError), err


def test_a_ring_of_blocking_sends_deadlocks_and_the_check_says_so(tmp_path):
    ok, message = _verdict(tmp_path, 13, HANG[13], timeout=8)
    assert not ok and "did not finish in 8 s: a deadlock" in message, message


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: f"ex{e.number:02d}")
def test_an_import_of_the_reference_is_refused(exercise, tmp_path):
    home = getattr(exercise.solution, "__module__", "") or ""
    modules = list(exercise.hidden) + [m for m in (home,) if m.startswith("hpcpar.")] + ["hpcpar.course.catalog"]
    for module in modules:
        ok, message = _verdict(tmp_path, exercise.number, f"import {module}\n")
        assert not ok and f"import of {module} refused" in message, message


def test_the_fence_covers_re_exports_attributes_and_the_ways_round(tmp_path):
    cases = {20: ["from hpcpar.precision import LossScaler\n",          # ex 20's answer in four lines
                  "import hpcpar\nLossScaler = hpcpar.precision.LossScaler\n",
                  "import importlib\n", "import sys\n"],
             16: ["from hpcpar.context_parallel.ring import merge\n"],   # the same function, re-exported
             13: ["from hpcpar.course.check_dp import ring_allreduce_mpi as ring_allreduce\n"]}
    for number, codes in cases.items():
        for code in codes:
            ok, message = _verdict(tmp_path, number, code)
            assert not ok and "refused" in message, (code, message)
    # what an exercise needs stays in reach
    module = guard.load(_file(tmp_path, 13, "from hpcpar.comm import wait_all\nimport numpy as np\n"),
                        BY_NUMBER[13].hidden)
    assert callable(module.wait_all)


# --- what the checks say ------------------------------------------------------------------------------

def test_messages_point_at_the_first_difference(tmp_path):
    ok, message = _verdict(tmp_path, 6, WRONG[6][0])
    assert "p=4, m=8, stage 0: the first 4 actions are right; action 5 is ('F', 4), 1F1B runs ('B', 0) there" \
        in message, message
    ok, message = _verdict(tmp_path, 1, WRONG[1][0])
    assert "message 1 (rank 0 -> 1) is not the sum of one chunk" in message
    ok, message = _verdict(tmp_path, 20, WRONG[20][4])                   # scale // 2 below 1
    assert "scale 4, steps inf inf inf: after step 3 (overflow) scale is 0.0, expected 0.5" in message, message
    ok, message = _verdict(tmp_path, 23, WRONG[23][7])                   # a float64 buffer for float32 shards
    assert "gather buffer is float64, its shard float32" in message, message
    ok, message = _verdict(tmp_path, 24, WRONG[24][4])
    assert "idles" in message or "until their W" in message, message


def test_qk_norm_written_as_the_hints_say_passes_and_a_constant_rstd_is_named(tmp_path):
    ok, message = _verdict(tmp_path, 27, QK_NORM.format(dx=QK_NORM_DX))
    assert ok, message
    ok, message = _verdict(tmp_path, 27, WRONG[27][0])
    assert "rstd is held constant" in message and "\n" not in message.split("\n  (a hint")[0], message
    ok, message = _verdict(tmp_path, 27, WRONG[27][1])       # one line, naming the first wrong element
    assert re.search(r"queries of shape \(B, heads, T, HS\) = \(2, 4, 3, 8\): dx\[0, 0, 0, \d+\] is \S+, "
                     r"expected \S+$", message.split("\n")[0]), message


def test_qk_norm_check_catches_what_only_the_finite_differences_see(tmp_path):
    code = QK_NORM.format(dx=QK_NORM_DX + " if x.shape != (2, 3, 4, 6) else 1.01 * (" + QK_NORM_DX + ")")
    ok, message = _verdict(tmp_path, 27, code)
    assert not ok and "central differences" in message, message


def test_causal_blocks_written_as_the_template_says_pass_and_the_whole_square_is_named(tmp_path):
    ok, message = _verdict(tmp_path, 29, _blocks(**BLOCKS_RIGHT))
    assert ok, message
    ok, message = _verdict(tmp_path, 29, WRONG[29][0])
    assert "block [0, 4)'s P has shape (2, 3, 4, 12), expected (2, 3, 4, 4) - it has keys after its last query" \
        in message, message


def test_ep_bytes_with_the_counts_pass_and_are_the_rows_of_the_run():
    from hpcpar.course.check_a2a import check_ep_rows_bytes, ep_rows_bytes
    rows = 16 // 4 * 64 * 2                     # batch over dp 4, sequence 64, top-2: the rank's rows
    assert ep_rows_bytes() == (4 * 2 * rows * 64 * 8,) * 2       # 4 all-to-alls a layer, 2 layers, float64
    check_ep_rows_bytes(tuple(b + 2 * 4 * 8 for b in ep_rows_bytes()))      # the counts too: within 1 %


def test_a_fixed_pipeline_program_passes_the_simulator(tmp_path):
    fixed = [GOOD[0], ["recvF0<0", "F0", "B0", "recvF1<0", "sendB0>0"] + GOOD[1][5:]]
    check_pp.precheck_program(fixed)                # the ranks run the key's answer above


def test_a_crash_in_the_students_code_names_its_line(tmp_path):
    ok, message = _verdict(tmp_path, 8, "def coords(rank, tp, pp, dp):\n    return 1 / 0\n")
    assert not ok and "ZeroDivisionError" in message and "line 2" in message


def test_the_measurement_is_held_to_the_checks_own_numbers_not_fixed_ones():
    check_measure.check_measurement(RIGHT33, MEASURED)
    slower = ({"pp2": 240.0, "dp2": 160.0}, 0.4)           # a machine twice as slow: the same ratio passes
    check_measure.check_measurement(RIGHT33, slower)
    tie = ({"pp2": 100.0, "dp2": 95.0}, 0.3)                 # within TIE: either layout may be named faster
    check_measure.check_measurement(dict(RIGHT33, faster="pp2", ms_per_step={"pp2": 100.0, "dp2": 96.0}), tie)


@pytest.mark.slow
def test_the_measurement_exercise_on_this_machine():
    ok, message = check_solution(BY_NUMBER[33])
    assert ok, message


def test_the_reference_orders_agree_with_the_engine():
    assert check_pp.one_f_one_b(0, 4, 8)[:5] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0)]
    assert check_pp.busy_of_total() == (16, 28)
    from hpcpar.watch.why import diagnose
    for what, records in check_hangs.cases():     # the culprits are the ones `hpcpar trace why` names first
        culprits, _ = check_hangs.hang_diagnosis(records, 8)
        text = diagnose(records, world=8)
        assert text.startswith(f"rank {culprits[0]} (") if culprits else text.startswith("every rank waits"), what
    from hpcpar.course.collectives import ring_allreduce
    xs = [np.arange(12.0) * (r + 1) for r in range(3)]
    sent = []
    out = ring_allreduce(xs, lambda s, d, c: sent.append((s, d)))
    assert all(np.array_equal(y, sum(xs)) for y in out) and len(sent) == 12


def test_a_plug_file_is_refused_in_one_line_when_it_cannot_run(tmp_path):
    from types import SimpleNamespace

    from hpcpar.runtime import UsageError
    from hpcpar.training import plug
    from hpcpar.training.config import TrainConfig, check
    with pytest.raises(UsageError, match="--plug: .* not found"):
        check(TrainConfig(plug=str(tmp_path / "none.py")), 1)
    with pytest.raises(UsageError, match="needs column_forward, column_backward, row_forward, row_backward"):
        plug.chosen(SimpleNamespace(column_forward=len))
    with pytest.raises(UsageError, match="defines none of"):
        plug.chosen(SimpleNamespace())


# --- hints, grading, the key ------------------------------------------------------------------------------

def test_hints_come_one_at_a_time_into_a_signed_log_that_shows_an_edit(tmp_path):
    key = hints.read_key(hints.make_key(tmp_path / "teacher.key"))
    alice = tmp_path / "alice"
    exercise = BY_NUMBER[16]
    shown = [hints.next_hint(exercise, alice, key) for _ in range(len(exercise.hints) + 1)]
    assert [s.split(":")[0] for s in shown] == [f"hint {k} of 3" for k in (1, 2, 3, 3)]
    assert "--hint again" in shown[0] and "--hint again" not in shown[2]
    hints.next_hint(BY_NUMBER[20], alice, key)
    assert hints.verify(alice, key) == ("verified", {16: 3, 20: 1})
    assert hints.verify(alice, None)[0] == "unsigned"
    log = alice / hints.LOG
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], lines[-1]]) + "\n")                 # two hints of 16 taken out
    assert hints.verify(alice, key)[0] == "tampered at line 2"
    log.write_text("\n".join(lines).replace('"hint": 3', '"hint": 1') + "\n")
    assert hints.verify(alice, key)[0].startswith("tampered")
    bob = tmp_path / "bob"                                                    # alice's log copied
    bob.mkdir()
    (bob / hints.LOG).write_text("\n".join(lines) + "\n")
    assert hints.verify(bob, key)[0] == "tampered at line 1"


def test_grading_a_class_of_right_wrong_hung_and_missing_answers(tmp_path):
    key_file = tmp_path / "teacher.key"
    assert main(["course", "keygen", str(key_file)]) == 0
    key = hints.read_key(key_file)
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    for folder in (alice, bob):
        folder.mkdir()
    shutil.copyfile(BY_NUMBER[8].solution_file, alice / "ex08.py")             # right; ex20 missing
    hints.next_hint(BY_NUMBER[8], alice, key)
    (bob / "ex08.py").write_text("def coords(rank, tp, pp, dp):\n    while True:\n        pass\n")   # hangs
    (bob / "ex20.py").write_text(WRONG[20][4])                                # scale // 2
    hints.next_hint(BY_NUMBER[20], bob, key)
    (bob / hints.LOG).write_text((bob / hints.LOG).read_text().replace('"hint": 1', '"hint": 0'))
    out = tmp_path / "grades"
    proc, _ = run([sys.executable, "-m", "hpcpar", "course", "grade", str(alice), str(bob), "--exercises", "8,20",
                   "--timeout", "4", "--key", str(key_file), "--csv", f"{out}.csv", "--json", f"{out}.json"],
                  timeout=120)
    assert proc.returncode == 0, proc.stderr
    grades = json.loads(Path(f"{out}.json").read_text())
    a, b = grades["alice"], grades["bob"]
    assert a["total"] == 1 and a["hints"] == "verified" and a["exercises"]["8"]["hints"] == 1
    assert a["first_failure"] == "exercise 20: no ex20.py"
    assert b["total"] == 0 and b["hints"] == "tampered at line 1"
    assert "ended after 4 s" in b["exercises"]["8"]["message"] and "not yet" in b["exercises"]["20"]["message"]
    assert b["first_failure"].startswith("exercise 8: ended after 4 s")
    rows = Path(f"{out}.csv").read_text().splitlines()
    assert rows[0].startswith("student,total,hint_log,ex08_points,ex08_hints,ex20_points,ex20_hints,first_failure")
    assert rows[1].startswith("alice,1,verified,1,1,0,0,")


def test_the_cli_starts_checks_hints_and_keeps_the_key_for_the_teacher(tmp_path, capsys):
    work = str(tmp_path / "work")
    assert main(["course", "start", "5", "7", "--dir", work]) == 0
    assert "course check 7 --dir" in capsys.readouterr().out
    assert main(["course", "check", "7", "--dir", work]) == 1 and "not written yet" in capsys.readouterr().out
    Path(work, "ex05.py").write_text("ANSWER = (16, 16)\n")
    assert main(["course", "check", "5", "--hint", "--dir", work]) == 1
    out = capsys.readouterr().out
    assert "not yet" in out and "hint 1 of 3" in out and "schedule" not in out   # the measuring command: on a pass
    assert main(["course", "check", "99"]) == 2 and "no exercise" in capsys.readouterr().err
    assert main(["course", "check", "3", "--dir", work]) == 2 and "course start 3" in capsys.readouterr().err
    assert main(["course", "list"]) == 0
    listed = capsys.readouterr().out
    assert "lesson 18: what comes next" in listed and "min)" in listed and "trainer" in listed
    with pytest.raises(SystemExit):                                              # --key is required
        main(["course", "key", "20"])
    assert main(["course", "key", "20", "--key", str(Path(work, "ex05.py"))]) == 2 and "not a course key" in \
        capsys.readouterr().err
    key = hints.make_key(tmp_path / "teacher.key")
    assert main(["course", "key", "20", "5", "--key", str(key)]) == 0
    text = capsys.readouterr().out
    assert "return scale / 2, 0, False" in text and "ANSWER = (16, 28)" in text and "Q: Why halve at once" in text


# --- the lessons -------------------------------------------------------------------------------------------

def _headings(page):
    return {line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")}


def _before_the_check(text):
    """A lesson up to its first "After" paragraph: what a student reads before the check passes."""
    return text.split("**After", 1)[0]


def test_every_lesson_reference_resolves():
    for page in sorted(COURSE.glob("[0-9][0-9]-*.md")) + [COURSE / "README.md", COURSE / "teaching.md"]:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]+\.(?:md|png))", text):           # markdown links and pictures
            assert (page.parent / target).exists(), f"{page.name}: link {target}"
        text = " ".join(text.split())                                     # references that wrap a line
        named = re.findall(r"docs/([\w/]+\.md) (?:up to|from) \"([^\"]+)\"", text) + \
            [(doc, heading) for heading, doc in re.findall(r"\"([^\"]+)\" (?:of|in) docs/([\w/]+\.md)", text)]
        for doc, heading in named:
            assert (DOCS / doc).exists(), f"{page.name}: {doc}"
            assert heading in _headings(DOCS / doc), f"{page.name}: {doc} has no heading {heading!r}"
        for doc in re.findall(r"docs/([\w/]+\.md)", text):
            assert (DOCS / doc).exists(), f"{page.name}: {doc}"
        for number in re.findall(r"\*\*Exercise (\d+)", text):
            assert BY_NUMBER[int(number)].lesson == page.name, f"{page.name}: exercise {number}"
        for path in re.findall(r"hpcpar/[\w/]+\.py", text):
            assert (DOCS.parent / path).exists(), f"{page.name}: {path}"


def test_the_readme_lists_every_lesson_in_order_with_its_minutes_and_picture():
    readme = (COURSE / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| [")]
    assert [re.match(r"\| \[(\S+)\]", row).group(1) for row in rows] == [lesson.page for lesson in LESSONS]
    for row, lesson in zip(rows, LESSONS):
        assert f"| {lesson.minutes} |" in row, row
        numbers = [int(n) for n in re.findall(r"(?<![\d.-])(\d+) [a-zA-Z]", row.split("|")[4])]
        assert numbers == [e.number for e in EXERCISES if e.lesson == lesson.page], row
        if lesson.picture:
            assert (COURSE / "img" / lesson.picture).exists() and f"img/{lesson.picture}" in \
                (COURSE / lesson.page).read_text(), lesson.page
    from hpcpar.course.pictures import PICTURES
    assert set(PICTURES) == {lesson.picture for lesson in LESSONS if lesson.picture}


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: f"ex{e.number:02d}")
def test_no_lesson_or_hint_hands_over_its_answer(exercise):
    text = (COURSE / exercise.lesson).read_text()
    before = " ".join(_before_the_check(text).split())
    for module in exercise.hidden:                       # the code that answers it, not before the check
        assert module.replace(".", "/") not in before and module not in before, f"{exercise.lesson}: {module}"
    if callable(exercise.solution) and exercise.solution.__name__ not in (exercise.name, "<lambda>") and \
            not exercise.solution.__module__.startswith("hpcpar.course"):     # the engine's function, by name
        assert exercise.solution.__name__ not in before, f"{exercise.lesson}: {exercise.solution.__name__}"
    for hint in exercise.hints:                          # ideas and methods, in words: no code
        assert not re.search(r"np\.|comm\.|wait_all|import |def |return |//|\[\w+\]|\w\(\)", hint), hint
    if exercise.name == "ANSWER" and exercise.number != 33:
        measure = exercise.after.split(": ", 1)[1].split(";")[0].split(" compares")[0]
        assert measure.split(" --")[0] not in text or measure not in text, f"{exercise.lesson} runs {measure}"
        answer = exercise.solution()
        flat = [n for v in (answer if isinstance(answer, tuple) else (answer,))
                for n in (v if isinstance(v, tuple) else (v,))]
        for n in flat:
            if n > 4:          # small numbers (the 2 of tp 2) are everywhere; the answers' own numbers are not
                assert not re.search(rf"(?<![\w.]){re.escape(f'{n:g}')}(?![\w.])", text), f"{exercise.lesson} prints {n:g}"


# --- exercises 37-41: documents, DeepSeek-V3, going on without a rank ------------------------------------

def test_the_new_checks_name_what_is_wrong(tmp_path):
    said = {(37, 3): "the second beginning with id 0", (38, 1): "the block of another rank",
            (39, 5): "counted for one layer", (40, 4): "zb-v, 2 chunks", (40, 5): "counts the token embedding",
            (41, 0): "which it already holds", (41, 1): "which does not hold it", (41, 2): "nothing gives new rank",
            (41, 3): "the fewest pieces to send", (41, 4): "no optimizer state travels",
            (41, 6): "computes another list"}
    for (number, i), text in said.items():
        ok, message = _verdict(tmp_path, number, WRONG[number][i])
        assert not ok and text in message, (number, i, message)


def test_the_cache_reference_is_what_generation_allocates():
    from hpcpar.course.check_deepseek import FIELDS, kv_cache_bytes
    from hpcpar.nn.gpt import GPT, preset
    from hpcpar.training.generate import new_cache
    for name in ("deepseek-tiny", "llama-tiny", "tiny"):
        cfg = preset(name, vocab_size=32, n_layer=2)
        cache = new_cache(GPT(cfg, 0, "float64"), 1, 3)                  # one sequence of 3 positions
        want = kv_cache_bytes({f: getattr(cfg.shape, f) for f in FIELDS}, 8)[0]
        assert sum(a.nbytes for pair in cache for a in pair) == 3 * want, name
