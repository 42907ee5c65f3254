"""Run the points of a sweep: one MPI job of ``hpcpar train`` each, stored as one JSON result each.

The output directory holds

    results/<mode>-<series>-n<N>.json   one per point: the command, its exit status, where and how it
                                        ran, and the figures of ``hpcpar train --summary-json``
    logs/<mode>-<series>-n<N>.log       the command line and everything the job printed
    scaling.csv, *.png                  the report (report.py), drawn from every result in results/

Each point is a fresh job, started with ``mpiexec -n N`` ($HPCPAR_MPIEXEC, else the mpiexec next to
this Python) or ``srun -n N`` ($HPCPAR_SRUN, else ``srun --mpi=pmi2``, inside a Slurm allocation).
A point that fails or outlives ``--timeout`` is recorded as such and the sweep goes on.
"""
import json
import os
import shlex
import socket
import sys
import time
from dataclasses import fields, replace

from hpcpar.training.config import check
from hpcpar.training.options import TrainConfig, config_from
from hpcpar.launch import THREAD_VARS, first_error, mpiexec, run_job
from hpcpar.tools.plan.layout import Layout
from hpcpar.runtime import UsageError
from hpcpar.tools.scaling.layouts import label, sizes

LAUNCHERS = ("mpiexec", "srun")
PER_POINT = ("tp", "pp", "dp", "batch_size", "progress", "summary_json")   # set by the sweep, point by point
# files every point would write over (the sweep keeps each point's figures in results/ instead)
SHARED_FILES = ("metrics", "trace", "save", "resume", "export")


def base_config(args):
    """The training options every point shares (defaults, --config file, flags), checked for options
    the sweep must set itself."""
    cfg, default = config_from(args), TrainConfig()
    for name in ("tp", "pp", "dp"):
        if getattr(cfg, name) != getattr(default, name):
            raise UsageError(f"--{name} is set point by point from --layouts: leave it out")
    for name in SHARED_FILES:
        if getattr(cfg, name, ""):
            raise UsageError(f"--{name}: every point would write the same file; the sweep keeps each "
                             f"point's figures in OUT/results instead")
    return cfg


def passed_flags(args):
    """The training flags given on the command line, as flags again, for every point's job."""
    flags = ["--config", args.config] if args.config else []
    for f in fields(TrainConfig):
        if f.name in PER_POINT or not hasattr(args, f.name):
            continue
        name, value = f.name.replace("_", "-"), getattr(args, f.name)
        if isinstance(f.default, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        else:
            flags += [f"--{name}", str(value)]
    return flags


def checked_configs(points, cfg):
    """Each point's configuration as ``hpcpar train`` will check it (a bad one is refused now, not
    minutes into the sweep); the check also fills in the derived micro-batches and chunks."""
    configs = []
    for p in points:
        lay = p.layout
        try:
            configs.append(check(replace(cfg, tp=lay.tp, pp=lay.pp, dp=lay.dp, batch_size=p.batch_size), p.ranks))
        except UsageError as err:
            raise UsageError(f"--layouts {p.series.name} at {p.ranks} ranks ({label(lay)}): {err}") from None
    return configs


def launch_prefix(launcher, ranks):
    if launcher == "srun":
        return shlex.split(os.environ.get("HPCPAR_SRUN") or "srun --mpi=pmi2") + ["-n", str(ranks)]
    if launcher == "mpiexec":
        return mpiexec() + ["-n", str(ranks)]
    raise UsageError(f"--launcher must be {' or '.join(LAUNCHERS)}, not {launcher!r}")


def train_command(point, launcher, flags, summary):
    lay = point.layout
    return [*launch_prefix(launcher, point.ranks), sys.executable, "-m", "hpcpar", "train",
            "--tp", str(lay.tp), "--pp", str(lay.pp), "--dp", str(lay.dp), "--batch-size", str(point.batch_size),
            *flags, "--no-progress", "--summary-json", str(summary)]


def runnable_others(samples=5, interval=0.1):
    """Processes other than this one ready to run, averaged over half a second before a run: how much
    of the machine other work wanted (Linux's /proc/stat; None elsewhere)."""
    counts = []
    for _ in range(samples):
        try:
            with open("/proc/stat") as f:
                counts += [int(line.split()[1]) - 1 for line in f if line.startswith("procs_running ")]
        except (OSError, ValueError):
            return None
        time.sleep(interval)
    return sum(counts) / len(counts) if counts else None


def run_point(point, cfg, launcher, flags, out, timeout, name):
    """One run of a point, start to finish: its result record (also written to results/<name>.json)."""
    log, summary = out / "logs" / f"{name}.log", out / "logs" / f"{name}.summary.json"
    summary.unlink(missing_ok=True)
    cmd = train_command(point, launcher, flags, summary)
    others = runnable_others()
    status, seconds = run_job(cmd, log, timeout)
    record = {"mode": point.mode, "series": point.series.name, "ranks": point.ranks, "layout": sizes(point.layout),
              "batch_size": point.batch_size, "microbatches": cfg.microbatches, "chunks": cfg.chunks,
              "schedule": cfg.schedule, "model": cfg.model, "steps": cfg.steps,
              "launcher": launcher, "command": cmd, "exit_status": status, "timed_out": status is None,
              "timeout_s": timeout, "wall_s": seconds, "log": str(log.relative_to(out)),
              "host": socket.gethostname(), "host_cpus": len(os.sched_getaffinity(0)), "runnable_others": others,
              "nodes": int(os.environ.get("SLURM_JOB_NUM_NODES", 1)),
              "threads": {var: os.environ.get(var) for var in THREAD_VARS},
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "summary": None}
    if status == 0 and summary.exists():
        record["summary"] = json.loads(summary.read_text())
        summary.unlink()
    elif status is None:
        record["error"] = f"no answer within {timeout} s"
    elif status:
        record["error"] = first_error(log)
    else:
        record["error"] = "exit status 0 but no --summary-json written"
    (out / "results" / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def describe(record):
    """One line about a finished run."""
    head = f"{record['series']:>12} {record['ranks']:>4} rank(s) {label(Layout(**record['layout']))}"
    s = record["summary"]
    if s is None:
        return f"{head}: FAILED ({record['error']}; log: {record['log']})"
    others = record["runnable_others"]
    return (f"{head}: {s['step_time_s'] * 1e3:9.1f} ms/step {s['tokens_per_s']:11,.0f} tokens/s"
            + ("" if others is None else f"  ({others:.1f} other processes wanted the {record['host_cpus']} cores)"))


def runs(points, repeat):
    """(point index, run name) of every run: the whole sweep ``repeat`` times, each time starting one
    point later, so that a burst of load from another job does not hit every run of the same point.
    With ``repeat`` > 1 the runs of a point are named <point>-run1, -run2, ..."""
    n = len(points)
    for r in range(repeat):
        for i in [*range(r % n, n), *range(r % n)]:
            yield i, points[i].name + (f"-run{r + 1}" if repeat > 1 else "")


def sweep(points, configs, launcher, flags, out, timeout, repeat=1, progress=True):
    """Run every point ``repeat`` times, a progress bar over the sweep; returns the result records."""
    from tqdm import tqdm
    for sub in ("results", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    records = []
    with tqdm(total=len(points) * repeat, desc="scaling", unit="run", disable=not progress, file=sys.stderr,
              dynamic_ncols=True) as bar:
        for i, name in runs(points, repeat):
            bar.set_postfix_str(f"{points[i].series.name} on {points[i].ranks}")
            records.append(run_point(points[i], configs[i], launcher, flags, out, timeout, name))
            bar.write(describe(records[-1]), file=sys.stdout)
            bar.update()
    return records
