"""The measured pipeline bubble, defined as the simulator defines it (simulate.py), so the two compare;
and the simulator's bubble for the F, B and W times a run measured.

A pipeline is the pp ranks that share tp and dp coordinates.  For each step and pipeline:

    bubble = 1 - sum over its ranks of busy time (F, B, W) / (pp x makespan)

with the makespan from the first rank's start to the last rank's end of the step.  Measured on one
node's monotonic clock (ranks on other nodes line up only approximately).
"""
import statistics

from hpcpar.pipeline.simulate import Costs, simulate


def pipeline_bubble(windows):
    """The mean bubble over steps and pipelines. ``windows``: (tp, dp, step, start, end, busy) of every
    rank's steps."""
    groups = {}
    for tp, dp, step, start, end, busy in windows:
        groups.setdefault((tp, dp, step), []).append((start, end, busy))
    shares = [1 - sum(b for *_, b in g) / (len(g) * (max(e for _, e, _ in g) - min(s for s, _, _ in g)))
              for g in groups.values() if max(e for _, e, _ in g) > min(s for s, _, _ in g)]
    return statistics.fmean(shares) if shares else 0.0


def engine_window(engine):
    """(start, end, busy seconds in F/B/W) of the step the engine just ran, on the shared clock."""
    busy = sum(end - start for start, end, op, _, _ in engine.timeline if op in ("F", "B", "W"))
    return engine.started, engine.started + (engine.timeline[-1][1] if engine.timeline else 0.0), busy


def mean_costs(timelines):
    """Mean seconds of one F, B and W action over the given timelines."""
    sums, counts = {"F": 0.0, "B": 0.0, "W": 0.0}, {"F": 0, "B": 0, "W": 0}
    for tl in timelines:
        for start, end, op, _, _ in tl:
            if op in sums:
                sums[op] += end - start
                counts[op] += 1
    return {op: sums[op] / counts[op] if counts[op] else 0.0 for op in sums}


def simulated_bubble(schedule, costs):
    """The simulator's bubble for ``schedule`` run with measured mean ``costs`` {F, B, W} (seconds)."""
    if schedule.stages == 1:
        return 0.0
    return simulate(schedule, Costs(F=costs["F"], B=costs["B"], W=costs["W"])).bubble
