"""The pipeline term (hpcpar/plan/bubble.py): the reduced simulation extrapolates exactly."""
import pytest

from hpcpar.pipeline.schedules import build
from hpcpar.pipeline.simulate import Costs, simulate
from hpcpar.plan.bubble import analytic_makespan, simulate_pipeline

CASES = [("1f1b", 4, 23, 1), ("gpipe", 4, 17, 1), ("interleaved", 4, 20, 2), ("zb-h1", 6, 25, 1),
         ("interleaved", 3, 14, 3), ("1f1b", 8, 40, 1)]


@pytest.mark.parametrize("schedule, p, m, v", CASES)
def test_extrapolation_equals_full_simulation(schedule, p, m, v):
    costs = (1.0, 1.9, 0.7, 0.13)
    got = simulate_pipeline(schedule, p, m, v, *costs)
    assert len(got.simulated) == 2            # m > 3p: the reduced problem was used
    full = simulate(build(schedule, p, m, v), Costs(*costs))
    assert got.makespan == pytest.approx(full.makespan, rel=1e-9)
    assert got.bubble == pytest.approx(full.bubble, abs=1e-9)
    assert list(got.peak_inflight) == list(full.peak_inflight)


def test_more_microbatches_shrink_the_bubble():
    bubbles = [simulate_pipeline("1f1b", 8, m, 1, 1, 2, 0, 0).bubble for m in (8, 16, 64, 512)]
    assert bubbles == sorted(bubbles, reverse=True)
    # 1F1B with uniform costs: (p - 1) / (m + p - 1) of the total (docs/design.md, Pipeline bubbles)
    assert bubbles[-1] == pytest.approx(7 / (512 + 7))


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_textbook_bubble_is_close(schedule, v):
    sim = simulate_pipeline(schedule, 4, 32, v, 1.0, 1.0, 1.0, 0.0).makespan
    assert analytic_makespan(schedule, 4, 32, v, 1.0, 1.0, 1.0, 0.0) == pytest.approx(sim, rel=0.05)
