"""The pipeline's time per step, from the pipeline simulator (hpcpar/pipeline/simulate.py).

The simulator runs the schedule's real instruction lists with the stage costs F, B, W (seconds per
micro-batch and chunk) and the p2p latency, and returns the makespan, the bubble (idle share of
device time) and each stage's peak number of micro-batch chunks in flight (activation memory).

Scaling to large m.  Once every stage is in its steady state (m >= p), one more group of p
micro-batches adds exactly p * v * (F + B + W) to the makespan - the warm-up and cool-down, hence the
idle time, do not change - and the peak in-flight count grows by a fixed step (0 for 1F1B, p * v for
GPipe).  So for m > 3p we simulate m1 = 2p + m mod p and m2 = m1 + p (same remainder, so the same
interleaved grouping) and extrapolate both linearly to m.  tests/test_plan_bubble.py checks this
against full simulations.  Results are cached: many layouts share p, m, v and costs, and more of them
share the instruction lists (built once per schedule, p, m and v).

Before simulating, the search ranks layouts with the textbook bubbles (``analytic_makespan``):
(p - 1) * (F + B + W) for GPipe and 1F1B, 1/v of that interleaved, (p - 1) * (F + B - W) for ZB-H1,
(p - 1) * max(F, F + B - 2W) for ZB-H2 and, in chunk costs, ZB-V (exact for m >= 2p - 1 while
W <= F <= B), (p - 1)(F + 2B - W) for DualPipeV (DualPipe's README, an upper bound) (Narayanan et
al. 2021; Qi et al. 2024; docs/pipeline.md).  The peak in flight is counted from each rank's order
until the action that frees a micro-batch's activations, W where the backward is split
(``held_inflight``); with m1 and m2 >= 2p every schedule's warm-up is whole, so the extrapolation
holds for the V schedules and ZB-H2 as well.
"""
from dataclasses import dataclass
from functools import lru_cache

from hpcpar.pipeline.schedules import KINDS


@dataclass(frozen=True)
class PipelineResult:
    makespan: float
    bubble: float
    peak_inflight: tuple      # per stage, micro-batch chunks held at once (until W: held_inflight)
    simulated: tuple          # the micro-batch counts actually simulated


@lru_cache(maxsize=64)
def _program(schedule, p, m, v):
    """The schedule, its instruction lists with messages prepared, and its peak in flight (its order's,
    not the timing's): the same for every cost of a search."""
    from hpcpar.pipeline.schedules import build
    from hpcpar.pipeline.simulate import prepare
    built = build(schedule, p, m, v)
    return built, prepare(built), held_inflight(built)


def held_inflight(built):
    """Per rank, the most chunk-forwards whose activations it keeps at once, each from its F until the
    action that frees it: its B, or its W where the backward is split (a W still needs the layer's
    inputs).  A rank's own order decides it, not the timing: the simulator's ``peak_inflight``, which
    counts until B, for schedules whose W follows its B at once or that have none."""
    freed_by = "W" if built.split_backward else "B"
    peaks = []
    for acts in built.actions:
        held = peak = 0
        for a in acts:
            held += (a.op == "F") - (a.op == freed_by)
            peak = max(peak, held)
        peaks.append(peak)
    return tuple(peaks)


@lru_cache(maxsize=4096)
def _simulate(schedule, p, m, v, F, B, W, latency):
    from hpcpar.pipeline.simulate import Costs, makespan
    built, program, peak = _program(schedule, p, m, v)
    return makespan(built, Costs(F=F, B=B, W=W, latency=latency), program=program), peak


def clear_caches():
    """Forget every simulation and instruction list (a benchmark timing the search from scratch)."""
    _simulate.cache_clear()
    _program.cache_clear()


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


# the idle time analytic_makespan counts below for the zero-bubble schedules, as --explain prints it
TEXTBOOK = {"zb-h1": ("(p-1)(F+B-W)", "Qi et al. 2024"),
            "zb-h2": ("(p-1)max(F, F+B-2W) + max(0, 2p-1-m)W", "Qi et al. 2024"),
            "zb-v": ("(p-1)(max(F, F+B-2W) + max(0, B-F)) + 2max(0, 2p-1-m)W", "Qi et al. 2024"),
            "dualpipev": ("(p-1)(F+2B-W) = (PP/2-1)(F&B+B-3W), F&B = F+B+W", "DualPipe's README")}


def analytic_makespan(schedule, p, m, v, F, B, W, latency):
    """The textbook estimate used to pre-rank layouts (F, B, W per chunk; docs/pipeline.md derives each)."""
    stage = v * (F + B + W)
    if schedule == "zb-h2":      # the ramp of the start times or rank 0's bubble; a W per missing warm-up F
        idle = (p - 1) * max(F, F + B - 2 * W) + max(0, 2 * p - 1 - m) * W
    elif schedule == "zb-v":     # the same in chunk costs, and what B is longer than F waits on the V's ramp
        idle = (p - 1) * (max(F, F + B - 2 * W) + max(0.0, B - F)) + 2 * max(0, 2 * p - 1 - m) * W
    elif schedule == "dualpipev":    # DualPipe's (PP/2 - 1)(F&B + B - 3W): PP = 2p, B whole, F&B = F + B + W
        idle = (p - 1) * (F + 2 * B - W)
    elif KINDS[schedule].chunked:
        idle = (p - 1) * stage / v
    elif KINDS[schedule].split_backward:
        idle = (p - 1) * max(F + B - W, 0.0)
    else:
        idle = (p - 1) * stage
    return m * stage + idle + 2 * (p - 1) * latency
