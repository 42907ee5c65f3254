"""The pipeline term (hpcpar/tools/plan/bubble.py): the reduced simulation extrapolates exactly, the peak in
flight counted from the schedule's order is the simulator's (until W where the backward is split),
and the closed forms that pre-rank layouts (memory.analytic_inflight, analytic_makespan) agree with
both."""
import pytest

from hpcpar.pipeline.schedules import SCHEDULES, KINDS, build
from hpcpar.pipeline.simulate import Costs, simulate
from hpcpar.tools.plan.bubble import analytic_makespan, held_inflight, simulate_pipeline
from hpcpar.tools.plan.memory import analytic_inflight

CASES = [("1f1b", 4, 23, 1), ("gpipe", 4, 17, 1), ("interleaved", 4, 20, 2), ("zb-h1", 6, 25, 1),
         ("interleaved", 3, 14, 3), ("1f1b", 8, 40, 1), ("zb-h2", 4, 21, 1), ("zb-h2", 5, 33, 1),
         ("zb-v", 4, 19, 2), ("zb-v", 6, 40, 2), ("dualpipev", 4, 19, 2), ("dualpipev", 3, 29, 2)]
# every p up to 16, with the m where the warm-ups change (p, 2p - 1, 2p) and beyond
SIZES = [(p, m) for p in (2, 3, 4, 5, 7, 8, 16) for m in sorted({1, p - 1, p, 2 * p - 1, 2 * p, 3 * p + 2, 64})
         if m >= 1]


@pytest.mark.parametrize("schedule, p, m, v", CASES)
def test_extrapolation_equals_full_simulation(schedule, p, m, v):
    costs = (1.0, 1.9, 0.7, 0.13)
    got = simulate_pipeline(schedule, p, m, v, *costs)
    assert len(got.simulated) == 2            # m > 3p: the reduced problem was used
    full = simulate(build(schedule, p, m, v), Costs(*costs))
    assert got.makespan == pytest.approx(full.makespan, rel=1e-9)
    assert got.bubble == pytest.approx(full.bubble, abs=1e-9)
    assert list(got.peak_inflight) == list(held_inflight(build(schedule, p, m, v)))
    if not KINDS[schedule].split_backward or KINDS[schedule].v_shape:   # W right after B, or none
        assert list(got.peak_inflight) == list(full.peak_inflight)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_analytic_inflight_is_the_count_from_the_order(schedule):
    """The closed forms (GPipe, 1F1B, interleaved; ZB-H1 p and ZB-H2 2p - 1 on every rank until W; ZB-V
    2p chunks, DualPipeV 2p + 1) against each rank's order, p <= 16."""
    kind = KINDS[schedule]
    for p, m in SIZES:
        v = kind.default_chunks
        if m < kind.fewest_microbatches(p) or (kind.chunked and not kind.v_shape and m % p):
            continue
        assert [analytic_inflight(schedule, p, m, v, r) for r in range(p)] == list(held_inflight(build(schedule, p, m, v)))


def test_zb_h2_peak_until_b_is_the_simulators():
    """ZB-H2 holds min(m, 2(p - r) - 1) micro-batches until B on rank r (the simulator's peak), and its
    postponed Ws bring every rank to rank 0's count until W."""
    for p, m in SIZES:
        built = build("zb-h2", p, m)
        until_b = simulate(built, Costs(1, 1, 1)).peak_inflight
        assert until_b == [min(m, 2 * (p - r) - 1) for r in range(p)]
        assert held_inflight(built) == (max(until_b),) * p


def test_more_microbatches_shrink_the_bubble():
    bubbles = [simulate_pipeline("1f1b", 8, m, 1, 1, 2, 0, 0).bubble for m in (8, 16, 64, 512)]
    assert bubbles == sorted(bubbles, reverse=True)
    # 1F1B with uniform costs: (p - 1) / (m + p - 1) of the total (docs/design.md, Pipeline bubbles)
    assert bubbles[-1] == pytest.approx(7 / (512 + 7))


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1), ("zb-v", 2),
                                         ("dualpipev", 2)])
@pytest.mark.parametrize("F, B, W", [(1.0, 1.0, 1.0), (1.0, 1.3, 0.9), (1.0, 2.0, 1.0), (1.2, 1.0, 0.8)])
def test_textbook_bubble_is_close(schedule, v, F, B, W):
    sim = simulate_pipeline(schedule, 4, 32, v, F, B, W, 0.0).makespan
    assert analytic_makespan(schedule, 4, 32, v, F, B, W, 0.0) == pytest.approx(sim, rel=0.05)


@pytest.mark.parametrize("F, B, W", [(1, 1, 1), (1, 1, 0.5), (1, 2, 1), (2, 3, 1), (1, 1, 0), (1, 3, 1)])
def test_zero_bubble_textbook_makespans_are_exact(F, B, W):
    """ZB-H2 for m >= 2p - 1 and ZB-V (chunk costs) while W <= F <= B: the simulator's makespan exactly."""
    for p, m in SIZES:
        if m >= 2 * p - 1:
            for schedule, v in (("zb-h2", 1), ("zb-v", 2)):
                sim = simulate(build(schedule, p, m, v), Costs(F, B, W)).makespan
                assert analytic_makespan(schedule, p, m, v, F, B, W, 0.0) == pytest.approx(sim, rel=1e-12)


@pytest.mark.parametrize("F, B, W", [(1, 1, 0), (1, 1, 1), (1, 2, 1), (2, 3, 1), (1, 2, 0.5)])
def test_dualpipev_textbook_is_the_readme_bound(F, B, W):
    """DualPipe's README bubble: exact at W = 0 with F = B, an upper bound of the makespan otherwise."""
    for p, m in SIZES:
        if m >= 2 * p:
            sim = simulate(build("dualpipev", p, m, 2), Costs(F, B, W)).makespan
            bound = analytic_makespan("dualpipev", p, m, 2, F, B, W, 0.0)
            assert sim <= bound + 1e-9
            if W == 0 and F == B:
                assert sim == pytest.approx(bound)


@pytest.mark.parametrize("schedule, v", [("zb-h2", 1), ("zb-v", 2), ("dualpipev", 2)])
def test_extrapolation_holds_for_the_longer_warm_ups(schedule, v):
    """ZB-H2's 2p - 1 forwards of warm-up and the V schedules' 2p: m1 = 2p + m mod p covers them, so
    one more group of p adds the same time and memory at every p <= 16 (with latency, uneven costs)."""
    costs = (1.0, 1.3, 0.6, 0.05)
    for p in (2, 3, 5, 8, 16):
        for m in (3 * p + 1, 5 * p + p // 2):
            got = simulate_pipeline(schedule, p, m, v, *costs)
            full = simulate(build(schedule, p, m, v), Costs(*costs))
            assert len(got.simulated) == 2
            assert got.makespan == pytest.approx(full.makespan, rel=1e-9)
            assert list(got.peak_inflight) == list(held_inflight(build(schedule, p, m, v)))
