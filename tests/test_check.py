"""The schedule checker (no MPI): each of the three published pipeline hang classes built as a small
schedule, named by ``check`` before any rank communicates, and which of them hpcpar's engine (Isend,
receives posted ahead - the simulator's default semantics) cannot hang on."""
from functools import partial

import pytest

from hpcpar.pipeline.check import ScheduleHazard, check
from hpcpar.pipeline.schedules import KINDS, SCHEDULES, Action, Schedule, build
from hpcpar.pipeline.simulate import simulate

F, B = (partial(Action, op) for op in "FB")


def hazard(*args, **kwargs):
    with pytest.raises(ScheduleHazard) as err:
        check(*args, **kwargs)
    return err.value


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_built_schedule_passes(name):
    kind = KINDS[name]
    v = 2 if kind.chunked else 1
    for p in (1, 2, 4):
        for m in range(kind.fewest_microbatches(p), 2 * p + 2):
            check(build(name, p, m, v))


def test_torchtitan_775_warmup_longer_than_the_microbatches():
    # 1F1B's warm-up of p-1-r forwards written without min(., m): at p = 4 with m = 2 rank 0
    # would run F0 F1 F2 before B0.  Structural: it hangs (or fails) everywhere, so always refused.
    unclamped = [[F(0), F(1), F(2), B(0), B(1), B(2)]] + build("1f1b", 4, 2).actions[1:]
    err = hazard(Schedule("1f1b-unclamped", 4, 2, 1, False, False, unclamped))
    assert err.kind == "warm-up"
    assert str(err) == ("rank 0 runs 3 forwards before its first backward B0, but m = 2 micro-batches "
                        "give 2")
    check(build("1f1b", 4, 2))                        # hpcpar's 1f1b clamps its warm-up
    assert hazard(build("1f1b", 4, 4), microbatches=2).kind == "warm-up"   # a file for another m


def _program(rows):
    """Instruction lists from text: "F0", "B1.1", "sendF0>1", "recvB0<1"."""
    out = []
    for row in rows:
        acts = []
        for word in row.split():
            if word[0] in "FBW":
                mb, _, chunk = word[1:].partition(".")
                acts.append(Action(word[0], int(mb), int(chunk or 0)))
            else:
                verb, what, rest = word[:4], word[4], word[5:]
                mb_chunk, peer = rest.split(">" if verb == "send" else "<")
                mb, _, chunk = mb_chunk.partition(".")
                acts.append(Action(f"{verb.upper()}_{what}", int(mb), int(chunk or 0), int(peer)))
        out.append(acts)
    return out


def test_pytorch_172668_two_node_hang_needs_blocking_sends():
    # Interleaved 1F1B on 2 ranks (stages 0, 2 on rank 0; 1, 3 on rank 1), forwards only as in
    # the report: rank 0 sends F1 of stage 0 before it receives F0 for stage 2, rank 1 sends F0 of
    # stage 1 before it receives F1.  Each send waits for a receive the other posts only after
    # its own send: a circle with blocking sends, none with Isend.
    s = build("interleaved", 2, 2, 2, forward_only=True)
    program = _program(["F0 sendF0>1 F1 sendF1>1 recvF0.1<1 F0.1 sendF0.1>1 recvF1.1<1 F1.1 sendF1.1>1",
                        "recvF0<0 F0 sendF0>0 recvF1<0 F1 sendF1>0 recvF0.1<0 F0.1 recvF1.1<0 F1.1"])
    check(s, program=program)                         # hpcpar's engine runs it
    simulate(s, program=program)
    err = hazard(s, program=program, blocking_sends=True)
    assert err.kind == "blocking"
    assert "rank 0 waits at instruction #3 sendF1>1 for rank 1" in str(err)
    assert "rank 1 waits at instruction #2 sendF0>0 for rank 0" in str(err)
    assert "cycle of waits: rank 0 -> rank 1 -> rank 0" in str(err)


def _fixed_order_batches(schedule):
    """Megatron's batched p2p with one fixed order for every rank: each run of messages between two
    computes is posted as one batch in the order send-to-previous, receive-from-previous,
    send-to-next, receive-from-next, and the batch waits for all of them."""
    out = []
    for rank, program in enumerate(schedule.with_communication()):
        rows, batch = [], []

        def flush():
            order = {("SEND", -1): 0, ("RECV", -1): 1, ("SEND", 1): 2, ("RECV", 1): 3}
            batch.sort(key=lambda a: order[a.op[:4], 1 if a.peer > rank else -1])
            rows.extend(batch)
            batch.clear()

        for i, a in enumerate(program):
            if a.peer is None:
                flush()
                rows.append(a)
            else:
                batch.append(a)
        flush()
        out.append(rows)
    return out


def test_megatron_5100_fixed_order_batches_need_blocking_sends():
    # 1F1B at pp 4: the steady state's "send my activation to the next, receive its gradient"
    # batches, all in one fixed order, chain every rank to both neighbours; with blocking
    # (batched) sends they wait in a circle, with Isend and receives posted ahead they do not
    s = build("1f1b", 4, 8)
    program = _fixed_order_batches(s)
    check(s, program=program)
    err = hazard(s, program=program, blocking_sends=True)
    assert err.kind == "blocking" and "cycle of waits: rank " in str(err)


def test_receive_ahead_of_compute_its_sender_waits_for():
    # rank 0 waits for B0 before it sends F1; rank 1 needs F1 before it runs B0: hangs anyway
    crossed = Schedule("crossed", 2, 2, 1, False, False, [[F(0), B(0), F(1), B(1)], [F(0), F(1), B(0), B(1)]])
    err = hazard(crossed)
    assert err.kind == "cycle"
    assert "cycle of waits: rank 0 -> rank 1 -> rank 0" in str(err)
    assert ("rank 0 receives recvB0<1 ahead of F1, which does not need it, while rank 1 waits for "
            "sendF1>1 that comes after: move recvB0<1 after sendF1>1") in str(err)


def test_receive_no_send_matches():
    s = build("1f1b", 2, 2)
    program = s.with_communication()
    program[0] = [a for a in program[0] if str(a) != "sendF1>1"]
    err = hazard(s, program=program)
    assert err.kind == "unmatched"
    assert "rank 1 waits at instruction #4 recvF1<0: no matching SEND_F anywhere" in str(err)
