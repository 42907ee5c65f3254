"""The layout search: every feasible way to run the job, ranked by predicted step time.

1. Enumerate (tp, pp, dp) with tp * pp * dp = GPUs - tp dividing the GPUs of a node (tensor
   parallelism talks inside every layer, so a TP group stays on one node's NVLink: Narayanan et al.
   2021, takeaway #1) - and for each the
   micro-batch sizes, schedules, chunks v, recomputation, ZeRO stage, context parallelism,
   expert parallelism (for a model with experts: every ep dividing both dp * cp and the experts),
   HSDP (on a job of several nodes, under ZeRO: besides sharding over every dp rank, shard groups of
   the most dp ranks whose tp * cp * dp-shard ranks fill part of one node) and sequence parallelism of
   the search space; drop what does not divide (Job.check).
2. Keep what fits in memory, and rank it with the textbook pipeline bubble (fast, analytic).
3. Re-estimate with the pipeline simulator the best ``refine`` of them and the best of every
   (tp, cp, pp, dp) grid within 30 % of the best, and rank again: that is the answer.  (The analytic and simulated bubbles differ
   by a few per cent, so a layout that the first ranking puts far down cannot reach the top.)

Sequence parallelism is never slower in this model and always smaller, so where it is allowed it is
the only choice for tp > 1; the other options compete on time and memory.
"""
import math
from dataclasses import dataclass
from itertools import product

from hpcpar.pipeline.schedules import KINDS
from hpcpar.tools.plan.layout import SCHEDULES, Layout
from hpcpar.tools.plan.step import estimate


GRID_WINDOW = 1.3    # a grid whose best analytic step is 30 % above the best is not simulated


@dataclass(frozen=True)
class Space:
    """What the search may choose; ``fixed`` pins fields (e.g. {"tp": 8, "pp": 12})."""
    schedules: tuple = SCHEDULES
    recompute: tuple = ("none", "selective", "full")
    zero: tuple = (0, 1, 3)              # ZeRO stages to try (3: FSDP)
    cp: tuple = (1,)                     # context-parallel sizes to try
    cp_kinds: tuple = ("ring", "ulysses")    # how cp > 1 attends: both tried unless pinned ("cp_kind")
    sp: tuple = (False, True)
    micro_batch_sizes: tuple = (1, 2, 4, 8)
    chunks: tuple = (2, 3, 4, 6, 8, 12)
    max_tp: int = 0                      # 0: the GPUs of one node
    hsdp: bool = True                    # on several nodes, ZeRO's HSDP shard groups inside a node too
    fixed: tuple = ()                    # ((field, value), ...)


def divisors(n):
    """The divisors of n, ascending: trial division up to the square root, each found with its partner."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def expert_sizes(model, shard):
    """The expert-parallel sizes to try: those dividing both the dp * cp ranks and the experts (1 alone
    without experts)."""
    return [e for e in divisors(shard) if model.experts % e == 0] if model.experts else [1]


def node_shard(job, space, tp, cp, dp):
    """The HSDP shard sizes to try besides 0 (every dp rank): on a job of several nodes the most dp ranks
    whose shard group, tp * cp * dp-shard consecutive ranks, fits a node evenly (none if that is all dp)."""
    if not space.hsdp or job.gpus <= job.gpus_per_node:
        return []
    fit = [d for d in divisors(dp) if job.gpus_per_node % (tp * cp * d) == 0]
    return [max(fit)] if fit and max(fit) < dp else []


def candidates(job, space=Space()):
    """Every layout of the space whose shapes divide (no memory check yet); ``space.fixed`` pins
    any of tp, cp, pp, dp, mb, v, schedule, recompute, zero, cp_kind, ep, dp_shard."""
    fixed = dict(space.fixed)
    max_tp = space.max_tp or job.gpus_per_node
    sp_choices = (True,) if True in space.sp else (False,)

    def free(name, options):
        return [fixed[name]] if name in fixed else list(options)

    for tp, cp in product(free("tp", divisors(job.gpus)), free("cp", space.cp)):
        if tp > max_tp or job.gpus_per_node % tp or job.gpus % (tp * cp):
            continue
        for pp in free("pp", divisors(job.gpus // (tp * cp))):
            dp = job.gpus // (tp * cp * pp)
            if fixed.get("dp", dp) != dp or dp * tp * cp * pp != job.gpus:
                continue
            for mb, schedule in product(free("mb", space.micro_batch_sizes), free("schedule", space.schedules)):
                if pp == 1 and schedule != "1f1b":     # without a pipeline every schedule is the same
                    continue
                kind = KINDS[schedule]      # a V has two arms: its only v is its default, 2
                chunks = free("v", (kind.default_chunks,) if kind.v_shape or not kind.chunked else space.chunks)
                kinds = free("cp_kind", space.cp_kinds) if cp > 1 else ["ring"]
                eps = free("ep", expert_sizes(job.model, dp * cp))
                shards = free("dp_shard", [0] + node_shard(job, space, tp, cp, dp))
                for v, rc, zero, kind, ep, hs in product(chunks, free("recompute", space.recompute),
                                                         free("zero", space.zero), kinds, eps, shards):
                    if hs and not zero:
                        continue
                    lay = Layout(tp, pp, dp, mb, v, schedule, rc, zero, sp_choices[0] and tp > 1, cp, kind, ep, hs)
                    if job.check(lay) is None:
                        yield lay


@dataclass
class Ranking:
    estimates: list            # fitting layouts, fastest first (simulated)
    considered: int            # layouts whose shapes divide
    fitting: int               # of those, the ones that fit in memory


def search(job, space=Space(), refine=40, require_fit=True, window=GRID_WINDOW):
    """Rank the job's feasible layouts; the first ``refine`` by the analytic model get simulated, and
    the best of every grid within ``window`` of the best.  ``require_fit=False`` keeps layouts the
    memory model rejects (to predict a run known to have run)."""
    considered, quick, per_search = 0, [], {}
    for lay in candidates(job, space):
        considered += 1
        est = estimate(job, lay, simulate=False, per_search=per_search)
        if est.fits or not require_fit:
            quick.append(est)
    quick.sort(key=lambda e: e.step)
    chosen, grids = list(quick[:refine]), {e.layout.grid() for e in quick[:refine]}
    for e in quick[refine:]:
        if e.step > window * quick[0].step:
            break
        if e.layout.grid() not in grids:
            grids.add(e.layout.grid())
            chosen.append(e)
    best = [estimate(job, e.layout, per_search=per_search) for e in chosen]
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
