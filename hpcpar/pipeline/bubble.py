"""The measured pipeline bubble, defined as the simulator defines it (simulate.py), so the two compare.

A pipeline is the pp ranks that share tp and dp coordinates.  For each step and pipeline:

    bubble = 1 - sum over its ranks of busy time (F, B, W) / (pp x makespan)

with the makespan from the first rank's start to the last rank's end of the step.  Measured on one
node's monotonic clock (ranks on other nodes line up only approximately).
"""
import statistics


def pipeline_bubble(windows):
    """The mean bubble over steps and pipelines. ``windows``: (tp, dp, step, start, end, busy) of every
    rank's steps."""
    groups = {}
    for tp, dp, step, start, end, busy in windows:
        groups.setdefault((tp, dp, step), []).append((start, end, busy))
    shares = [1 - sum(b for *_, b in g) / (len(g) * (max(e for _, e, _ in g) - min(s for s, _, _ in g)))
              for g in groups.values() if max(e for _, e, _ in g) > min(s for s, _, _ in g)]
    return statistics.fmean(shares) if shares else 0.0
