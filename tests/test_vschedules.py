"""The V-shaped schedules (no MPI): ZB-V and DualPipeV place rank r's two chunks at stages r and
2p-1-r, DualPipeV pairs a forward with a backward, and the simulator reproduces the published
bubbles and activation memories - the zero-bubble paper's table (ZB-H1 (p-1)(F+B-W) at 1F1B's
memory p, ZB-H2 (p-1)(F+B-2W) at 2p-1, ZB-V (p-1)(F+B-2W) at 1F1B's memory; the repository's
T_F = T_B = T_W column: a third of 1F1B's bubble, none, none) and DualPipe's README
((PP/2-1)(F&B+B-3W), PP+1 activations) - for p <= 16 and m <= 64."""
import pytest

from hpcpar.pipeline.schedules import Action, build
from hpcpar.pipeline.simulate import Costs, simulate

# every p up to 16, and for each the m where the formulas change (the warm-up's, 2p-1 and 2p)
# and beyond, up to 64
SIZES = [(p, m) for p in (1, 2, 3, 4, 5, 8, 16)
         for m in sorted({1, p, 2 * p - 1, 2 * p, 2 * p + 1, 3 * p + 2, 64}) if m >= 1]


def test_v_placement_puts_both_ends_on_rank_0():
    s = build("zb-v", 4, 8, 2)
    assert [[s.stage(r, c) for c in (0, 1)] for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert s.holders()[0][0] == s.holders()[7][0] == 0
    programs = s.with_communication()
    # the turn of the V: stage 3 -> stage 4 stays on rank 3, no message
    assert not any(a.op == "SEND_F" and a.chunk == 0 for a in programs[3])
    assert Action("SEND_F", 0, 1, 2) in programs[3]      # stage 4 -> stage 5 on rank 2
    assert Action("RECV_F", 0, 1, 1) in programs[0]      # the last stage, 7, hears from rank 1


@pytest.mark.parametrize("name", ["zb-v", "dualpipev"])
def test_v_schedules_take_exactly_two_chunks(name):
    with pytest.raises(ValueError, match="exactly 2 chunks per rank as a V, got chunks = 3"):
        build(name, 2, 8, 3)


def test_dualpipev_refuses_fewer_than_2p_microbatches():
    with pytest.raises(ValueError, match="the dualpipev schedule needs at least 8 micro-batches on 4 "
                                         "stages .*, got 7"):
        build("dualpipev", 4, 7, 2)


def test_dualpipev_pairs_a_forward_with_a_backward_of_another_microbatch():
    s = build("dualpipev", 4, 10, 2)
    for acts in s.actions:
        pairs = [(a, b) for a, b in zip(acts, acts[1:]) if a.overlap]
        assert pairs and all(a.op == "F" and b.op == "B" and a.chunk != b.chunk and a.mb != b.mb
                             for a, b in pairs)
    assert "F9.1& B5 " in s.table()                 # a pair on rank 0
    # one group for the pair's messages: both receives, then F's activation leaves while B computes
    program = " ".join(map(str, s.with_communication()[1]))
    assert "recvF6<0 recvB2.1<0 F6 sendF6>2 B2.1 sendB2.1>2" in program


@pytest.mark.parametrize("costs", [Costs(1, 1, 1), Costs(2, 2, 2)])
def test_zero_bubble_table_equal_costs(costs):
    # T_F = T_B = T_W: ZB-H1 idles a third of 1F1B, ZB-V not at all once m >= 2p - 1 (before,
    # 2(2p-1-m) chunk slots: the forwards its warm-up needs are missing); both at 1F1B's memory,
    # p micro-batches through a whole stage (ZB-V: 2p through half a stage each)
    for p, m in SIZES:
        ref, h1 = simulate(build("1f1b", p, m), costs), simulate(build("zb-h1", p, m), costs)
        zbv = simulate(build("zb-v", p, m, 2), costs)
        if m >= p:
            assert h1.bubble_per_rank() == pytest.approx(ref.bubble_per_rank() / 3)
        assert zbv.bubble_per_rank() == pytest.approx(max(0, 2 * (2 * p - 1 - m)) * costs.F)
        assert max(h1.peak_inflight) == max(ref.peak_inflight) == min(p, m)
        assert max(zbv.peak_inflight) == 2 * min(p, m)            # chunks: half a stage each


@pytest.mark.parametrize("F, B, W", [(1, 1, 1), (1, 2, 1), (2, 1, 1), (2, 3, 1), (1, 1, 0.5), (1, 1, 0),
                                     (3, 1, 1)])
def test_zb_h2_idles_p_minus_1_times_f_plus_b_minus_2w_at_2p_minus_1_microbatches(F, B, W):
    # the paper's table, while W <= min(F, B): with m >= 2p - 1 (the warm-up's forwards exist) a
    # rank idles (p-1)(F+B-2W), nothing at F = B = W, holding up to 2p - 1 micro-batches (rank r:
    # 2(p-r) - 1); each micro-batch missing from the warm-up leaves one W's worth of gap.  The
    # step's makespan adds the ramp of the ranks' start times, (p - 1) F or the bubble if longer.
    t = F + B + W
    for p, m in SIZES:
        r = simulate(build("zb-h2", p, m), Costs(F, B, W))
        assert r.bubble_per_rank() == pytest.approx((p - 1) * (F + B - 2 * W) + max(0, 2 * p - 1 - m) * W)
        assert r.peak_inflight == [min(2 * (p - rank) - 1, m) for rank in range(p)]
        if m >= 2 * p - 1:
            assert r.makespan == pytest.approx(m * t + (p - 1) * max(F, F + B - 2 * W))


def test_zb_h2_trades_memory_for_the_bubble_zb_h1_keeps():
    # same makespan as ZB-H1 at F = B = W (the ramp (p-1)F is ZB-H1's whole bubble there), but the
    # ramp is only start times: ZB-H1 idles (p-1)(F+B-W) = 3 on a rank, ZB-H2 nothing
    h1, h2 = simulate(build("zb-h1", 4, 8)), simulate(build("zb-h2", 4, 8))
    assert h1.makespan == h2.makespan == 27
    assert (h1.bubble_per_rank(), h2.bubble_per_rank()) == (3, 0)
    assert (max(h1.peak_inflight), max(h2.peak_inflight)) == (4, 7)


@pytest.mark.parametrize("F, B, W", [(1, 1, 0.5), (2, 2, 1), (3, 3, 1), (1, 1, 0)])
def test_zb_v_idles_p_minus_1_times_f_plus_b_minus_2w(F, B, W):
    # with T_F = T_B (the handcrafted V's assumption) and W <= F, in chunk costs
    for p, m in SIZES:
        if m >= 2 * p - 1:
            r = simulate(build("zb-v", p, m, 2), Costs(F, B, W))
            assert r.bubble_per_rank() == pytest.approx((p - 1) * (F + B - 2 * W))


@pytest.mark.parametrize("F, B, W", [(1, 1, 0), (2, 2, 0), (2, 1, 1)])
def test_dualpipev_bubble_is_the_readme_formula(F, B, W):
    # (PP/2 - 1)(F&B + B - 3W) with PP = 2p stages, B the whole backward (B + W here) and F&B
    # the pair run back to back (F + B + W); peak PP + 1 chunk activations
    for p, m in SIZES:
        if m >= 2 * p:
            r = simulate(build("dualpipev", p, m, 2), Costs(F, B, W))
            assert r.bubble_per_rank() == pytest.approx((p - 1) * ((F + B + W) + (B + W) - 3 * W))
            assert max(r.peak_inflight) == 2 * p + 1


@pytest.mark.parametrize("F, B, W", [(1, 1, 1), (1, 2, 1), (1, 2, 0.5), (2, 3, 1), (3, 2, 1), (1, 3, 0)])
def test_dualpipev_bubble_at_most_the_readme_formula(F, B, W):
    # exact where above; below it when W fills more than the formula counts on.  It holds while
    # a forward is no longer than a whole backward (F <= B + W); a longer F would wait longer
    for p, m in SIZES:
        if m >= 2 * p:
            r = simulate(build("dualpipev", p, m, 2), Costs(F, B, W))
            assert r.bubble_per_rank() <= (p - 1) * ((F + B + W) + (B + W) - 3 * W) + 1e-9


def test_overlapped_pair_costs_fb():
    # an F&B pair that overlaps fully costs its longer half: the step shortens by what it hides
    plain = simulate(build("dualpipev", 2, 8, 2), Costs(1, 1, 1))
    fast = simulate(build("dualpipev", 2, 8, 2), Costs(1, 1, 1, FB=2))
    pairs = sum(a.overlap for a in build("dualpipev", 2, 8, 2).actions[0])
    assert fast.busy[0] == pytest.approx(plain.busy[0] - pairs * 1)
    assert fast.makespan < plain.makespan


def test_cli_compare_export_load_check(tmp_path):
    from mpitools import hpcpar, run
    proc, _ = run(hpcpar() + ["schedule", "--stages", "4", "--microbatches", "8", "--compare", "--costs", "1,2,1"])
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()[2:9]}
    assert set(rows) == {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipev"}
    assert rows["1f1b"][0] == "44" and rows["zb-v"][:3] == ["35", "8.6%", "3"] and rows["zb-v"][3] == "4"
    csv = tmp_path / "zbv.csv"
    proc, _ = run(hpcpar() + ["schedule", "--stages", "2", "--microbatches", "4", "--schedule", "zb-v",
                              "--export", str(csv)])
    assert proc.returncode == 0 and csv.read_text().startswith("0F0,0F1,0F2,3F0,3I0,3W0,")
    proc, _ = run(hpcpar() + ["schedule", "--load", str(csv), "--check"])
    assert proc.returncode == 0 and "no hang" in proc.stdout
    proc, _ = run(hpcpar() + ["schedule", "--load", str(csv), "--check", "--blocking-sends"])
    assert proc.returncode == 1 and "refused (blocking)" in proc.stdout
    assert "cycle of waits: rank 0 -> rank 1 -> rank 0" in proc.stdout
    proc, _ = run(hpcpar() + ["schedule", "--stages", "4", "--microbatches", "7", "--schedule", "dualpipev"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("needs at least 8 micro-batches on 4 stages "
                                                         "(its warm-up alone runs that many), got 7")
