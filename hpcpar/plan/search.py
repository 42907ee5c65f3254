"""The layout search: every feasible way to run the job, ranked by predicted step time.

1. Enumerate (tp, pp, dp) with tp * pp * dp = GPUs - tp dividing the GPUs of a node (tensor
   parallelism talks inside every layer, so a TP group stays on one node's NVLink: Narayanan et al.
   2021, takeaway #1) - and for each the
   micro-batch sizes, schedules, chunks v, recomputation, ZeRO-1 and sequence parallelism of the
   search space; drop what does not divide (Job.check).
2. Keep what fits in memory, and rank it with the textbook pipeline bubble (fast, analytic).
3. Re-estimate with the pipeline simulator the best ``refine`` of them and the best of every
   (tp, pp, dp) grid within 30 % of the best, and rank again: that is the answer.  (The analytic and simulated bubbles differ
   by a few per cent, so a layout that the first ranking puts far down cannot reach the top.)

Sequence parallelism is never slower in this model and always smaller, so where it is allowed it is
the only choice for tp > 1; the other options compete on time and memory.
"""
from dataclasses import dataclass
from itertools import product

from hpcpar.plan.layout import SCHEDULES, Layout
from hpcpar.plan.step import estimate


GRID_WINDOW = 1.3    # a grid whose best analytic step is 30 % above the best is not simulated


@dataclass(frozen=True)
class Space:
    """What the search may choose; ``fixed`` pins fields (e.g. {"tp": 8, "pp": 12})."""
    schedules: tuple = SCHEDULES
    recompute: tuple = ("none", "selective", "full")
    zero1: tuple = (False, True)
    sp: tuple = (False, True)
    micro_batch_sizes: tuple = (1, 2, 4, 8)
    chunks: tuple = (2, 3, 4, 6, 8, 12)
    max_tp: int = 0                      # 0: the GPUs of one node
    fixed: tuple = ()                    # ((field, value), ...)


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(job, space=Space()):
    """Every layout of the space whose shapes divide (no memory check yet)."""
    fixed = dict(space.fixed)
    max_tp = space.max_tp or job.gpus_per_node
    sp_choices = (True,) if True in space.sp else (False,)
    for tp in divisors(job.gpus):
        if tp > max_tp or job.gpus_per_node % tp or fixed.get("tp", tp) != tp:
            continue
        for pp in divisors(job.gpus // tp):
            dp = job.gpus // (tp * pp)
            if fixed.get("pp", pp) != pp or fixed.get("dp", dp) != dp:
                continue
            for mb, schedule in product(space.micro_batch_sizes, space.schedules):
                if fixed.get("mb", mb) != mb or fixed.get("schedule", schedule) != schedule:
                    continue
                if pp == 1 and schedule != "1f1b":     # without a pipeline every schedule is the same
                    continue
                chunks = space.chunks if schedule == "interleaved" else (1,)
                for v, rc, z1 in product(chunks, space.recompute, space.zero1):
                    if fixed.get("v", v) != v:
                        continue
                    lay = Layout(tp, pp, dp, mb, v, schedule, rc, z1, sp_choices[0] and tp > 1)
                    if job.check(lay) is None:
                        yield lay


@dataclass
class Ranking:
    estimates: list            # fitting layouts, fastest first (simulated)
    considered: int            # layouts whose shapes divide
    fitting: int               # of those, the ones that fit in memory


def search(job, space=Space(), refine=40, require_fit=True):
    """Rank the job's feasible layouts; the first ``refine`` by the analytic model get simulated.
    ``require_fit=False`` keeps layouts the memory model rejects (to predict a run known to have run)."""
    considered, quick = 0, []
    for lay in candidates(job, space):
        considered += 1
        est = estimate(job, lay, simulate=False)
        if est.fits or not require_fit:
            quick.append(est)
    quick.sort(key=lambda e: e.step)
    chosen, grids = list(quick[:refine]), {e.layout.grid() for e in quick[:refine]}
    for e in quick[refine:]:
        if e.step > GRID_WINDOW * quick[0].step:
            break
        if e.layout.grid() not in grids:
            grids.add(e.layout.grid())
            chosen.append(e)
    best = [estimate(job, e.layout) for e in chosen]
    best = sorted((e for e in best if e.fits or not require_fit), key=lambda e: e.step)
    return Ranking(best, considered, len(quick))


def best_per_grid(ranking):
    """The fastest layout of every (tp, pp, dp) grid, fastest first."""
    best = {}
    for e in ranking.estimates:
        best.setdefault(e.layout.grid(), e)
    return list(best.values())


def grid_rank(ranking, grid):
    """1-based rank of the best layout with (tp, pp, dp) = ``grid`` among the distinct grids, or None."""
    grids = [e.layout.grid() for e in best_per_grid(ranking)]
    return grids.index(grid) + 1 if grid in grids else None
