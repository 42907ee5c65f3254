"""Checking the planner against published runs (published.py): throughput, memory and the ranking.

For a run, the planner searches the layouts that framework had with everything the source states
pinned ((tp, cp, pp, dp), and micro-batch size, chunks, schedule, recomputation where published);
the fastest such layout is the prediction - whether or not the memory model says it fits, since the
run did run.  Throughput: ratio = published / predicted step time, i.e. the predicted per-GPU
throughput over the published one (1.0 is perfect, 1.2 means 20 % optimistic).  Memory: predicted /
published GiB per GPU, where the source gives one.

"Top choice": the search is repeated with (tp, cp, pp, dp) free, among the layouts that fit.  The
published grid is a top choice when its best layout is among the 3 best grids or within 5 % of the
best layout's step time.
"""
from dataclasses import dataclass, replace

from hpcpar.tools.plan.hardware import load_hardware
from hpcpar.tools.plan.job import Job
from hpcpar.tools.plan.models import load_model
from hpcpar.tools.plan.search import Space, best_per_grid, grid_rank, search

TOP_MARGIN = 0.05
TOP_GRIDS = 3
GiB = 2**30


def run_hardware(run, calibration=None):
    hw = load_hardware(run.hardware)
    c = run.hardware_changes
    if "inter_GBps" in c:
        hw = replace(hw, inter=replace(hw.inter, bandwidth=c["inter_GBps"] * 1e9))
    if "memory_GiB" in c:
        hw = replace(hw, memory_bytes=c["memory_GiB"] * GiB)
    if "hbm_GBps" in c:
        hw = replace(hw, hbm_bandwidth=c["hbm_GBps"] * 1e9)
    if calibration is not None:
        hw = replace(hw, calibration=calibration)
    return hw


def run_job(run, calibration=None, engine=None):
    f = run.features
    hw = run_hardware(run, calibration)
    return Job(load_model(run.model), hw, run.gpus, hw.gpus_per_node, run.global_batch, run.seq_len,
               dtype=f["dtype"], engine=engine or f["engine"])


def run_space(run, pin_grid=True):
    f = run.features
    # the published runs with cp used a ring or an all-gather of K/V (engine.cp_allgather), not Ulysses
    fixed = {"mb": run.mb, "v": run.v, "schedule": run.schedule, "recompute": run.recompute, "cp_kind": "ring"}
    if pin_grid:
        fixed.update(tp=run.tp, pp=run.pp, dp=run.dp, cp=run.cp, ep=run.ep)
    cps = (run.cp,) if run.cp > 1 else (1,)
    return Space(schedules=f["schedules"], recompute=f["recompute"], zero=f["zero"], sp=f["sp"], cp=cps,
                 fixed=tuple((k, v) for k, v in fixed.items() if v))


def run_grid(run):
    return run.tp, run.cp, run.pp, run.dp


@dataclass
class Check:
    run: object
    predicted: object          # Estimate of the published grid
    published_step: float
    best: object               # Estimate of the best fitting layout with a free grid (None: nothing fits)
    grid_best: object          # Estimate of the best fitting layout with the published grid (or None)
    grid_rank: int             # rank of the published grid among distinct grids (None: does not fit)

    @property
    def ratio(self):
        """Predicted per-GPU throughput / published."""
        return self.published_step / self.predicted.step

    @property
    def memory_ratio(self):
        """Predicted / published memory per GPU (None where the source gives none)."""
        if not self.run.memory_gib:
            return None
        return self.predicted.memory_peak / (self.run.memory_gib * GiB)

    @property
    def top_choice(self):
        if self.grid_best is None or self.best is None:
            return False
        return self.grid_best.step <= self.best.step * (1 + TOP_MARGIN) or self.grid_rank <= TOP_GRIDS


def predict(run, calibration=None, engine=None):
    """The planner's estimate for the run's published layout: the fastest of the unpublished choices
    that fits in memory, or the fastest of all when none fits (the run did run)."""
    job = run_job(run, calibration, engine)
    for require_fit in (True, False):
        ranking = search(job, run_space(run), refine=3, require_fit=require_fit, window=1.0)
        if ranking.estimates:
            return ranking.estimates[0]
    return None


def check(run, calibration=None, engine=None):
    job = run_job(run, calibration, engine)
    predicted = predict(run, calibration, engine)
    free = search(job, run_space(run, pin_grid=False), refine=3, window=1 + 2 * TOP_MARGIN)
    mine = [e for e in best_per_grid(free) if e.layout.grid() == run_grid(run)]
    return Check(run, predicted, run.published_step(job.model), free.estimates[0] if free.estimates else None,
                 mine[0] if mine else None, grid_rank(free, run_grid(run)))


def _pct(x):
    return "    -" if x is None else f"{x - 1:+5.0%}"


def report(runs=None):
    """The table ``hpcpar plan --validate`` prints: every run, predicted vs published, and the summary
    of the held-out rows (the rows no constant was fitted to)."""
    from hpcpar.tools.plan.published import RUNS
    runs = RUNS if runs is None else runs
    head = (f"{'run':44s} {'role':17s} {'framework':18s} {'throughput':>10s} {'memory':>7s} {'top 3':>5s}  "
            "predicted layout")
    lines = [head, "-" * len(head)]
    held = []
    for run in runs:
        c = check(run)
        lines.append(f"{run.name[:44]:44s} {run.role:17s} {run.framework:18s} {_pct(c.ratio):>10s} "
                     f"{_pct(c.memory_ratio):>7s} {'yes' if c.top_choice else 'no':>5s}  {c.predicted.layout}")
        if run.role == "validation":
            held.append(c)
    thr = [c for c in held if abs(c.ratio - 1) <= 0.15]
    mem = [c for c in held if c.memory_ratio is not None]
    mem_ok = [c for c in mem if abs(c.memory_ratio - 1) <= 0.20]
    top = [c for c in held if c.top_choice]
    frameworks = sorted({c.run.framework for c in held})
    lines += ["", f"held out: {len(held)} runs from {len(frameworks)} frameworks ({', '.join(frameworks)})",
              f"  throughput within 15 %: {len(thr)} of {len(held)}",
              f"  memory within 20 %:     {len(mem_ok)} of {len(mem)} with published memory",
              f"  published grid a top choice (top 3 grids or within 5 % of the best): {len(top)} of {len(held)}"]
    return "\n".join(lines)
