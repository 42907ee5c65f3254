"""jobs/gpu_check.sh in its dry run: every step of the device check runs on this machine (the tests on
the CuPy stand-in, the benchmark on numpy with a tiny model), so the script cannot rot between the
rare visits to a GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

from mpitools import mpiexec

ROOT = Path(__file__).resolve().parent.parent


def test_the_device_check_runs_through_in_a_dry_run(tmp_path):
    env = dict(os.environ, HPCPAR_GPU_CHECK_DRY_RUN="1", PYTHON=sys.executable, OUT=str(tmp_path),
               HPCPAR_MPIEXEC=" ".join(mpiexec(1)[:-2]))
    proc = subprocess.run(["bash", "jobs/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "== done: all passed" in proc.stdout
    for log in ("gpu_tests_1rank.log", "gpu_tests_2ranks.log"):
        assert " passed" in (tmp_path / log).read_text(), log
    step = json.loads((tmp_path / "gpu_step.json").read_text())
    figures = step["benchmarks"]["gpu-step"]["runs"][0]["figures"]
    assert figures["dry_run"] and {"fp32", "fp16", "bf16", "staging"} <= set(figures)
    assert "| precision | ours |" in (tmp_path / "gpu_step.md").read_text()
