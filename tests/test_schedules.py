"""Pipeline schedules as data (no MPI): for every schedule, p = 1..8 stages and m = 1..16
micro-batches (v = 2, 3 chunks for interleaved), each micro-batch passes each virtual stage exactly
once forward, once backward and once through W when the backward is split, in order on each rank."""
from collections import Counter
from functools import partial

import pytest

from hpcpar.pipeline.schedules import KINDS, SCHEDULES, Action, Schedule, build, validate

VARIANTS = [(name, v) for name in SCHEDULES
            for v in ((2,) if KINDS[name].v_shape else (2, 3) if KINDS[name].chunked else (1,))]


def every_size(name, v, forward_only=False):
    for p in range(1, 9):
        for m in range(KINDS[name].fewest_microbatches(p), 17):
            yield build(name, p, m, v, forward_only)


@pytest.mark.parametrize("name, v", VARIANTS)
@pytest.mark.parametrize("forward_only", [False, True])
def test_each_microbatch_passes_each_stage_once_per_pass(name, v, forward_only):
    for s in every_size(name, v, forward_only):
        p, m = s.stages, s.microbatches
        counts = Counter((a.op, a.mb, s.stage(r, a.chunk))
                         for r, acts in enumerate(s.actions) for a in acts)
        ops = ["F"] if forward_only else ["F", "B", "W"] if s.split_backward else ["F", "B"]
        expected = Counter({(op, mb, st): 1 for op in ops for mb in range(m) for st in range(p * v)})
        assert counts == expected, (name, p, m, v)
        validate(s)


@pytest.mark.parametrize("name, v", VARIANTS)
def test_rank_runs_f_before_b_before_w(name, v):
    for s in every_size(name, v):
        for acts in s.actions:
            where = {(a.op, a.mb, a.chunk): i for i, a in enumerate(acts)}
            for (op, mb, c), i in where.items():
                if op == "B":
                    assert where["F", mb, c] < i
                if op == "W":
                    assert where["B", mb, c] < i


def test_1f1b_has_the_picotron_shape():
    s = build("1f1b", 4, 6)
    assert " ".join(map(str, s.actions[0])) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"   # 3 warm-up
    assert " ".join(map(str, s.actions[3])) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"   # none
    # m < p: fewer warm-up forwards, nothing else changes
    assert " ".join(map(str, build("1f1b", 4, 2).actions[0])) == "F0 F1 B0 B1"


def test_gpipe_runs_all_forwards_then_all_backwards():
    assert " ".join(map(str, build("gpipe", 3, 3).actions[1])) == "F0 F1 F2 B0 B1 B2"


def test_zb_h1_rank_r_postpones_w_by_r_backwards():
    s = build("zb-h1", 4, 8)
    for r, acts in enumerate(s.actions):
        order = [a for a in acts if a.op in "BW"]
        for i in range(8):
            w = order.index(Action("W", i))
            if i + r < 8:
                assert order[w - 1] == Action("B", i + r)   # W(i) right after B(i + r) ...
            else:
                assert all(a.op == "W" for a in order[w:])   # ... or in the final run of Ws
    assert build("zb-h1", 2, 2).split_backward and not build("1f1b", 2, 2).split_backward


def test_interleaved_order_and_leftover_group():
    s = build("interleaved", 2, 4, 2)
    forwards = [str(a) for a in s.actions[1] if a.op == "F"]
    assert forwards == ["F0", "F1", "F0.1", "F1.1", "F2", "F3", "F2.1", "F3.1"]   # groups of p
    backwards = [str(a) for a in s.actions[1] if a.op == "B"]
    assert backwards == ["B0.1", "B1.1", "B0", "B1", "B2.1", "B3.1", "B2", "B3"]
    # m = 5 on p = 2: the leftover micro-batch joins the first group (3, then 2)
    forwards = [str(a) for a in build("interleaved", 2, 5, 2).actions[0] if a.op == "F"]
    assert forwards[:6] == ["F0", "F1", "F2", "F0.1", "F1.1", "F2.1"]


def test_forward_only_keeps_the_forward_order():
    full, fwd = build("interleaved", 3, 5, 2), build("interleaved", 3, 5, 2, forward_only=True)
    assert fwd.forward_only and fwd.actions == [[a for a in acts if a.op == "F"]
                                                for acts in full.actions]


def test_with_communication_1f1b_two_stages():
    programs = build("1f1b", 2, 2).with_communication()
    assert " ".join(map(str, programs[0])) == "F0 sendF0>1 F1 sendF1>1 recvB0<1 B0 recvB1<1 B1"
    assert " ".join(map(str, programs[1])) == "recvF0<0 F0 B0 sendB0>0 recvF1<0 F1 B1 sendB1>0"


@pytest.mark.parametrize("name, v", VARIANTS)
def test_every_send_has_one_receive(name, v):
    for s in every_size(name, v):
        p = s.stages
        sends, recvs = Counter(), Counter()
        for r, program in enumerate(s.with_communication()):
            assert [a for a in program if a.peer is None] == s.actions[r]
            for a in program:
                stage = s.stage(r, a.chunk)
                if a.op.startswith("SEND"):
                    step = 1 if a.op == "SEND_F" else -1
                    assert a.peer == s.holders()[stage + step][0]
                    sends[a.op[-1], a.mb, stage + step] += 1
                elif a.op.startswith("RECV"):
                    recvs[a.op[-1], a.mb, stage] += 1
        assert sends == recvs
        assert all(n == 1 for n in sends.values())
        # messages cross every stage boundary, once per micro-batch and direction
        # (but for a hop between two stages of one rank, the turn of a V, which stays in memory)
        hops = sum(s.holders()[t][0] != s.holders()[t + 1][0] for t in range(p * v - 1))
        assert len(sends) == (1 if s.forward_only else 2) * s.microbatches * hops


def test_interleaved_chunk_hop_goes_from_last_rank_to_rank_0():
    programs = build("interleaved", 2, 2, 2).with_communication()
    assert Action("SEND_F", 0, 0, 0) in programs[1]    # stage 1 (rank 1, chunk 0) -> stage 2
    assert Action("RECV_F", 0, 1, 1) in programs[0]    # stage 2 = rank 0, chunk 1
    assert Action("SEND_B", 0, 1, 1) in programs[0]    # backward: stage 2 -> stage 1


def test_action_names():
    assert str(Action("F", 3)) == "F3"
    assert str(Action("B", 3, 1)) == "B3.1"
    assert str(Action("SEND_F", 3, 0, 2)) == "sendF3>2"
    assert str(Action("RECV_B", 0, 1, 1)) == "recvB0.1<1"


def test_table():
    assert build("1f1b", 2, 2).table() == (
        "1f1b: p=2 stages, m=2 micro-batches\n"
        "rank 0: F0 F1 B0 B1\n"
        "rank 1: F0 B0 F1 B1")
    assert "v=2 chunks per rank (X.c = chunk c)" in build("interleaved", 2, 2, 2).table()


@pytest.mark.parametrize("args, msg", [
    (("pipedream", 2, 2), "unknown schedule 'pipedream'"),
    (("1f1b", 0, 2), "stages must be a positive integer, got 0"),
    (("1f1b", 2, -1), "microbatches must be a positive integer"),
    (("interleaved", 2, 4, 1), "needs chunks >= 2"),
    (("zb-h1", 2, 4, 2), "zb-h1 needs chunks = 1, got 2"),
])
def test_impossible_combinations_refused(args, msg):
    with pytest.raises(ValueError, match=msg):
        build(*args)


def _broken(actions, split=False):
    return Schedule("broken", len(actions), 2, 1, split, False, actions)


F, B, W = (partial(Action, op) for op in "FBW")   # F(3) == Action("F", 3)


@pytest.mark.parametrize("actions, split, msg", [
    ([[F(0), F(1), B(0), B(1)], [F(0), F(1), B(1)]], False, "rank 1: B0 is missing"),
    ([[F(0), F(1), B(0), B(1), B(1)]], False, "rank 0: B1 runs more than once"),
    ([[F(0), B(1), F(1), B(0)]], False, "rank 0: B1 runs before F1"),
    ([[F(0), F(1), B(0), W(0), W(1), B(1)]], True, "rank 0: W1 runs before B1"),
    ([[F(0), F(1), B(0), W(0), B(1), W(1)]], False, "rank 0: W0 is not an action"),
    ([[F(0), F(2), B(0), B(2)]], False, "rank 0: F2 is not an action"),
])
def test_validate_names_rank_and_action(actions, split, msg):
    with pytest.raises(ValueError, match=msg):
        validate(_broken(actions, split))
