"""The pipeline's time per step, from the pipeline simulator (hpcpar/pipeline/simulate.py).

The simulator runs the schedule's real instruction lists with the stage costs F, B, W (seconds per
micro-batch and chunk) and the p2p latency, and returns the makespan, the bubble (idle share of
device time) and each stage's peak number of micro-batch chunks in flight (activation memory).

Scaling to large m.  Once every stage is in its steady state (m >= p), one more group of p
micro-batches adds exactly p * v * (F + B + W) to the makespan - the warm-up and cool-down, hence the
idle time, do not change - and the peak in-flight count grows by a fixed step (0 for 1F1B, p * v for
GPipe).  So for m > 3p we simulate m1 = 2p + m mod p and m2 = m1 + p (same remainder, so the same
interleaved grouping) and extrapolate both linearly to m.  tests/test_plan_bubble.py checks this
against full simulations.  Results are cached: many layouts share p, m, v and costs.

Before simulating, the search ranks layouts with the textbook bubbles (``analytic_makespan``):
(p - 1) * (F + B + W) for GPipe and 1F1B, 1/v of that interleaved, (p - 1) * (F + B - W) for ZB-H1
(Narayanan et al. 2021; Qi et al. 2024).
"""
from dataclasses import dataclass
from functools import lru_cache

from hpcpar.pipeline.schedules import KINDS


@dataclass(frozen=True)
class PipelineResult:
    makespan: float
    bubble: float
    peak_inflight: tuple      # per stage, micro-batch chunks held at once
    simulated: tuple          # the micro-batch counts actually simulated


@lru_cache(maxsize=4096)
def _simulate(schedule, p, m, v, F, B, W, latency):
    from hpcpar.pipeline.schedules import build
    from hpcpar.pipeline.simulate import Costs, simulate
    r = simulate(build(schedule, p, m, v), Costs(F=F, B=B, W=W, latency=latency))
    return r.makespan, tuple(r.peak_inflight)


def simulate_pipeline(schedule, p, m, v, F, B, W, latency):
    """Makespan, bubble and peak in-flight of one step; F, B, W are per micro-batch *chunk*."""
    work = m * v * (F + B + W)              # busy time of every stage
    if p == 1:
        return PipelineResult(work, 0.0, (m * v if KINDS[schedule].all_forwards_first else 1,), (m,))
    if m <= 3 * p:
        makespan, peak = _simulate(schedule, p, m, v, F, B, W, latency)
        sims = (m,)
    else:
        m1 = 2 * p + m % p
        m2 = m1 + p
        t1, peak1 = _simulate(schedule, p, m1, v, F, B, W, latency)
        t2, peak2 = _simulate(schedule, p, m2, v, F, B, W, latency)
        groups = (m - m2) / p
        makespan = t2 + groups * (t2 - t1)
        peak = tuple(round(b + groups * (b - a)) for a, b in zip(peak1, peak2))
        sims = (m1, m2)
    return PipelineResult(makespan, 1 - work / makespan, peak, sims)


def analytic_makespan(schedule, p, m, v, F, B, W, latency):
    """The textbook estimate used to pre-rank layouts (F, B, W per chunk)."""
    stage = v * (F + B + W)
    if KINDS[schedule].chunked:
        idle = (p - 1) * stage / v
    elif KINDS[schedule].split_backward:
        idle = (p - 1) * max(F + B - W, 0.0)
    else:
        idle = (p - 1) * stage
    return m * stage + idle + 2 * (p - 1) * latency
