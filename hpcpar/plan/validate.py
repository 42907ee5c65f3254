"""Checking the planner against published runs (published.py): predicted throughput and ranking.

For a run, the planner searches the layouts that engine had (its features) with the published
(tp, pp, dp) and whatever else the paper states pinned; the fastest fitting one is the prediction.
Its step time is compared with the published one: ratio = published / predicted step, i.e. the
predicted per-GPU throughput over the published (1.0 is perfect, 1.2 means 20 % optimistic).

"Top choices": the search is repeated with (tp, pp, dp) free (among the layouts that fit).  The
published grid is a top choice when its best fitting layout is within 10 % of the best layout's step
time, or when it is among the 5 best (tp, pp, dp) grids.
"""
from dataclasses import dataclass, replace

from hpcpar.plan.hardware import Link, load_hardware
from hpcpar.plan.job import Job
from hpcpar.plan.models import load_model
from hpcpar.plan.search import Space, best_per_grid, grid_rank, search

TOP_MARGIN = 0.10
TOP_GRIDS = 5


def run_hardware(run, calibration=None):
    hw = load_hardware(run.hardware)
    changes = dict(run.hardware_changes)
    if "inter_bandwidth" in changes:
        hw = replace(hw, inter=Link(changes.pop("inter_bandwidth"), hw.inter.latency, hw.inter.efficiency))
    if calibration is not None:
        hw = replace(hw, calibration=calibration)
    return hw


def run_job(run, calibration=None):
    f = run.features
    hw = run_hardware(run, calibration)
    return Job(load_model(run.model), hw, run.gpus, hw.gpus_per_node, run.global_batch, run.seq_len,
               dtype=f["dtype"], engine=f["engine"])


def run_space(run, pin_grid=True):
    f = run.features
    fixed = {"mb": run.mb, "v": run.v}
    if pin_grid:
        fixed.update(tp=run.tp, pp=run.pp, dp=run.dp)
    return Space(schedules=f["schedules"], recompute=f["recompute"], zero1=f["zero1"], sp=f["sp"],
                 fixed=tuple((k, v) for k, v in fixed.items() if v))


@dataclass
class Check:
    run: object
    predicted: object          # Estimate of the published grid
    published_step: float
    best: object               # Estimate of the best layout with a free grid
    grid_best: object          # Estimate of the best fitting layout with the published grid (or None)
    grid_rank: int             # rank of the published grid among distinct grids (None: nothing fits)

    @property
    def ratio(self):
        """Predicted per-GPU throughput / published."""
        return self.published_step / self.predicted.step

    @property
    def top_choice(self):
        if self.grid_best is None:
            return False
        return self.grid_best.step <= self.best.step * (1 + TOP_MARGIN) or self.grid_rank <= TOP_GRIDS


def predict(run, calibration=None):
    """The planner's best estimate for the run's published grid (None if nothing fits)."""
    job = run_job(run, calibration)
    ranking = search(job, run_space(run), refine=8, require_fit=False)
    return ranking.estimates[0] if ranking.estimates else None


def check(run, calibration=None):
    job = run_job(run, calibration)
    predicted = predict(run, calibration)
    free = search(job, run_space(run, pin_grid=False), refine=20)
    grid = (run.tp, run.pp, run.dp)
    mine = [e for e in best_per_grid(free) if e.layout.grid() == grid]
    return Check(run, predicted, run.published_step(job.model), free.estimates[0],
                 mine[0] if mine else None, grid_rank(free, grid))
