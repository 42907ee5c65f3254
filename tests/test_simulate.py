"""The schedule simulator and ``hpcpar schedule`` (no MPI): the bubble formulas of docs/design.md
reproduced exactly, the memory bound of 1F1B, the deadlocks it detects, and the assembly-line example."""
from functools import partial

import pytest

from hpcpar.pipeline.plot import plot_timeline
from hpcpar.pipeline.schedules import COMPUTE, KINDS, SCHEDULES, Action, Schedule, build
from hpcpar.pipeline.simulate import Costs, DeadlockError, _pairs, makespan, message_key, prepare, simulate
from hpcpar.pipeline.timeline import ascii_timeline
from mpitools import hpcpar, run

SIZES = [(p, m) for p in range(1, 9) for m in range(1, 17)]
F, B = (partial(Action, op) for op in "FB")   # F(3) == Action("F", 3)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("costs", [Costs(F=1, B=1, W=0), Costs(F=1, B=1, W=1), Costs(F=2, B=1, W=0)])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(name, costs):
    for p, m in SIZES:
        r = simulate(build(name, p, m), costs)
        assert r.makespan == pytest.approx((m + p - 1) * (costs.F + costs.B + costs.W))
        assert r.bubble == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


def test_forward_only_is_the_seed_assembly_line():
    for p, m in SIZES:
        r = simulate(build("gpipe", p, m, forward_only=True))
        assert r.makespan == m + p - 1 and r.busy_share == pytest.approx([m / (m + p - 1)] * p)
    # each of the p - 1 hops adds one message latency to the first micro-batch's trip
    r = simulate(build("1f1b", 4, 8, forward_only=True), Costs(F=1, latency=0.5))
    assert r.makespan == 8 + 3 * 1.5


def test_1f1b_holds_at_most_p_microbatches_gpipe_all_m():
    for p, m in SIZES:
        assert simulate(build("1f1b", p, m)).peak_inflight == [min(p - r, m) for r in range(p)]
        assert simulate(build("gpipe", p, m)).peak_inflight == [m] * p


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("costs", [Costs(F=1, B=1, W=0), Costs(F=1, B=2, W=0)])
def test_interleaved_bubble_is_p_minus_1_over_vm_of_ideal(v, costs):
    # Exact for every m >= p (not only multiples of p: the leftover joins the first group).
    # With m < p the ring of p ranks is never full: a lap of v chunks costs p, not m, slots.
    t = costs.F + costs.B
    for p, m in SIZES:
        r = simulate(build("interleaved", p, m, v), costs)
        ideal = m * v * t
        if m >= p:
            assert r.makespan / ideal - 1 == pytest.approx((p - 1) / (v * m), abs=1e-12), (p, m)
        else:
            assert r.makespan == (v * p + m - 1) * t, (p, m)


def test_interleaved_holds_more_chunks_but_smaller_ones():
    # rank r keeps (v-1) p + 2 (p-1-r) + 1 chunks of 1/v of its layers: p (1 + (p-1)/(p v)) layers'
    # worth on rank 0, against p for 1F1B
    assert simulate(build("interleaved", 4, 8, 2)).peak_inflight == [11, 9, 7, 5]


def test_zb_h1_cuts_the_bubble_at_the_same_peak_memory():
    for p, m in SIZES:
        zb, ref = simulate(build("zb-h1", p, m)), simulate(build("1f1b", p, m))   # F = B = W = 1
        assert zb.peak_inflight == ref.peak_inflight
        assert zb.bubble < ref.bubble or p == 1
        if m >= p:   # 1F1B idles (p-1)(F+B+W) per rank, ZB-H1 (p-1)(F+B-W): a third here
            assert zb.makespan == 3 * m + (p - 1)
            assert ref.makespan - 3 * m == 3 * (p - 1)


@pytest.mark.parametrize("costs", [Costs(F=1, B=2, W=1), Costs(F=2, B=1, W=1), Costs(F=1, B=1, W=0.5)])
def test_zb_h1_idles_p_minus_1_times_f_plus_b_minus_w(costs):
    # exact while W <= min(F, B): a longer W no longer fits into the gaps it fills
    for p, m in SIZES:
        if m >= p:
            r = simulate(build("zb-h1", p, m), costs)
            idle = (p - 1) * (costs.F + costs.B - costs.W)
            assert r.makespan == pytest.approx(m * (costs.F + costs.B + costs.W) + idle)


@pytest.mark.parametrize("name", SCHEDULES)
def test_simulated_times_respect_every_dependency(name):
    v = 2 if KINDS[name].chunked else 1
    costs = Costs(F=1, B=2, W=0.5, latency=0.25)
    for p, m in [(1, 3), (3, 5), (4, 8), (5, 3)]:
        if m < KINDS[name].fewest_microbatches(p):
            continue
        r = simulate(build(name, p, m, v), costs)
        end = {}
        for evs in r.events:
            for e in evs:
                end[e.action.op, e.action.mb, r.schedule.stage(e.rank, e.action.chunk)] = e
        # a message between ranks takes the latency; a hop on one rank (p = 1, a V's turn) does not
        hop = lambda s, t: costs.latency if r.schedule.holders()[s][0] != r.schedule.holders()[t][0] else 0
        for (op, mb, s), e in end.items():
            if op == "F" and s > 0:
                assert e.start >= end["F", mb, s - 1].end + hop(s - 1, s)
            if op == "B" and s < p * v - 1:
                assert e.start >= end["B", mb, s + 1].end + hop(s + 1, s)
            if op == "B":
                assert e.start >= end["F", mb, s].end
        for evs in r.events:
            assert all(a.end <= b.start for a, b in zip(evs, evs[1:]))   # one action at a time


def plain_makespan(s, costs):
    """The simulator's rules run the plain way, with clocks (each rank in turn until it must wait for a
    message not yet sent), for the prepared replay to be checked against."""
    program = s.with_communication()
    cs = costs if isinstance(costs, list) else [costs] * len(program)
    pc, clock, arrival, moved = [0] * len(program), [0.0] * len(program), {}, True
    while moved:
        moved = False
        for r, prog in enumerate(program):
            pairs = _pairs(prog)
            while pc[r] < len(prog):
                a = prog[pc[r]]
                if a.op in COMPUTE:
                    clock[r] += (cs[r].pair_share() if pc[r] in pairs else 1.0) * cs[r].of(a, s.split_backward)
                elif a.op.startswith("SEND"):
                    arrival[message_key(r, a, s)] = clock[r] + cs[r].latency
                elif message_key(r, a, s) in arrival:
                    clock[r] = max(clock[r], arrival.pop(message_key(r, a, s)))
                else:
                    break
                pc[r], moved = pc[r] + 1, True
    return max(clock)


@pytest.mark.parametrize("name", SCHEDULES)
def test_one_prepared_program_replays_every_cost_as_a_fresh_run(name):
    """The planner prepares a program once and simulates it under many costs: each replay gives, to
    the last bit, what the plain clocked run gives, a simulation from scratch the same (makespan, every
    event), and ``makespan`` alone the same number; a cost shared by F&B pairs (FB) and per-rank costs
    included."""
    v = 2 if KINDS[name].chunked else 1
    for p, m in [(2, 4), (4, 8), (5, 12)]:
        s = build(name, p, m, v)
        ready = prepare(s)
        for costs in (Costs(F=1, B=2, W=0.5, latency=0.25), Costs(F=0.3, B=1 / 3, W=0.1, latency=0.01, FB=0.6),
                      [Costs(F=1 + r / 7, B=2, W=0.4, latency=0.1 * r) for r in range(p)]):
            fresh, replayed = simulate(s, costs), simulate(s, costs, program=ready)
            assert replayed.makespan == plain_makespan(s, costs)
            assert replayed.rows() == fresh.rows() and replayed.makespan == fresh.makespan
            if not isinstance(costs, list):
                assert makespan(s, costs, program=ready) == fresh.makespan


def test_simulator_never_deadlocks_on_a_built_schedule():
    for name in SCHEDULES:
        kind = KINDS[name]
        for v in ((2,) if kind.v_shape else (2, 3) if kind.chunked else (1,)):
            for p, m in SIZES:
                if m >= kind.fewest_microbatches(p):
                    simulate(build(name, p, m, v), Costs(F=1, B=1, W=1, latency=0.1))


def test_deadlock_two_ranks_each_receiving_before_sending():
    # rank 0 wants B0 before it sends F1; rank 1 wants F1 before it computes B0
    crossed = Schedule("crossed", 2, 2, 1, False, False,
                       [[F(0), B(0), F(1), B(1)], [F(0), F(1), B(0), B(1)]])
    with pytest.raises(DeadlockError) as err:
        simulate(crossed)
    text = str(err.value)
    assert "rank 0 waits at instruction #2 recvB0<1 for rank 1" in text
    assert "rank 1 waits at instruction #2 recvF1<0 for rank 0" in text
    assert "cycle of waits: rank 0 -> rank 1 -> rank 0" in text


def test_deadlock_receive_without_send():
    orphan = Schedule("orphan", 2, 2, 1, False, False, [[F(0), B(0), B(1)], [F(0), B(0), F(1), B(1)]])
    with pytest.raises(DeadlockError, match=r"rank 1 waits at instruction #4 recvF1<0: no matching "
                                            r"SEND_F anywhere \(rank 0 never sends it\)"):
        simulate(orphan)


def test_send_without_receive():
    program = [[F(0), Action("SEND_F", 0, 0, 1)], []]
    with pytest.raises(DeadlockError, match="messages were never received:\n  rank 0 sent F of "
                                            "micro-batch 0 to rank 1"):
        simulate(build("1f1b", 2, 1, forward_only=True), program=program)


def test_blocking_sends_deadlock_1f1b_but_not_gpipe():
    # In the steady state rank 0 sends F1 while rank 1 sends B0: with rendezvous sends both wait
    # for a receive the other will only post after its own send.
    with pytest.raises(DeadlockError) as err:
        simulate(build("1f1b", 2, 4), blocking_sends=True)
    text = str(err.value)
    assert "rank 0 waits at instruction #3 sendF1>1 for rank 1" in text
    assert "rank 1 waits at instruction #3 sendB0>0 for rank 0" in text
    assert "cycle of waits" in text
    # GPipe's sends all go one way at a time: it survives rendezvous, only slower
    assert simulate(build("gpipe", 4, 4), blocking_sends=True).makespan >= 14


ASSEMBLY_LINE_M4 = """\
time   0  1  2  3  4  5  6
dev 0  F0 F1 F2 F3 .  .  .
dev 1  .  F0 F1 F2 F3 .  .
dev 2  .  .  F0 F1 F2 F3 .
dev 3  .  .  .  F0 F1 F2 F3
makespan  7 time units
busy      dev 0 57%  dev 1 57%  dev 2 57%  dev 3 57%
units     16 busy of 28 (4 devices x 7 time units)
bubble    43% of device time = 75% of the ideal (busy) time
"""


def test_ascii_timeline_of_the_assembly_line():
    text = ascii_timeline(simulate(build("1f1b", 4, 4, forward_only=True)))
    assert text.startswith(ASSEMBLY_LINE_M4)
    text = ascii_timeline(simulate(build("1f1b", 4, 1, forward_only=True)))
    assert "dev 3  .  .  .  F0\nmakespan  4 time units\n" in text
    assert "dev 1 25%" in text and "bubble    75% of device time" in text


def test_ascii_timeline_units_and_chunks():
    text = ascii_timeline(simulate(build("interleaved", 2, 2, 2), Costs(F=0.5, B=1, W=0)))
    assert "(one column = 0.5 time units)" in text
    assert "F0.1" in text and "B1.1 B1.1" in text   # a backward spans two columns


def test_cli_assembly_line():
    proc, _ = run(hpcpar() + ["schedule", "--stages", "4", "--microbatches", "4", "--forward-only"])
    assert proc.returncode == 0 and ASSEMBLY_LINE_M4 in proc.stdout
    proc, _ = run(hpcpar() + ["schedule", "--stages", "4", "--microbatches", "1", "--forward-only"])
    assert "makespan  4 time units" in proc.stdout
    assert "busy      dev 0 25%  dev 1 25%  dev 2 25%  dev 3 25%" in proc.stdout
    assert "bubble    75% of device time" in proc.stdout


def test_cli_table_plot_and_deadlock(tmp_path):
    png = tmp_path / "zb.png"
    proc, _ = run(hpcpar() + ["schedule", "--stages", "4", "--microbatches", "8", "--schedule",
                              "zb-h1", "--table", "--plot", str(png)])
    assert proc.returncode == 0, proc.stderr
    assert "rank 3: F0 B0 F1 B1" in proc.stdout and "makespan  27 time units" in proc.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    proc, _ = run(hpcpar() + ["schedule", "--stages", "2", "--microbatches", "4", "--blocking-sends"])
    assert proc.returncode == 1 and "cycle of waits: rank 0 -> rank 1 -> rank 0" in proc.stdout


@pytest.mark.parametrize("flags, msg", [
    (["--costs", "1,x"], "--costs takes three non-negative numbers F,B,W, got '1,x'"),
    (["--costs", "1,1"], "--costs takes three"),
    (["--latency", "-1"], "--latency must be a non-negative number"),
    (["--costs", "1,nan,1"], "--costs takes three"),
    (["--chunks", "2"], "1f1b needs chunks = 1"),
    (["--schedule", "interleaved", "--chunks", "1"], "needs chunks >= 2"),
])
def test_cli_bad_flags_one_line(flags, msg):
    proc, _ = run(hpcpar() + ["schedule", "--stages", "4", "--microbatches", "4"] + flags)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1
    assert lines[0].startswith("hpcpar: error: ") and msg in lines[0]


def test_plot_is_generic(tmp_path):
    rows = [[(0, 1, "F", 0, 0), (1, 1.5, "send", None, 0), (1.5, 3, "allreduce", None, 0)],
            [(0.5, 2.5, "B", 12, 1), (2.5, 3, "W", 12, 1)]]
    path = tmp_path / "measured.png"
    plot_timeline(rows, path, title="measured", unit_label="seconds",
                  labels=["rank 0 tp0.pp0.dp0", "rank 5 tp1.pp1.dp0"])
    assert path.read_bytes()[:4] == b"\x89PNG"
