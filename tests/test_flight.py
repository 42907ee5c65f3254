"""The pure parts of hang detection, without MPI: the flight recorder's ring buffer, the alarm files,
and the diagnosis text of `hpcpar trace why` from synthetic records (hpcpar/comm/flight.py, alarm.py,
watch/why.py); and, under MPI, that the communication wrappers fill the recorder."""
import numpy as np
import pytest

from hpcpar.watch import alarm
from hpcpar.comm import flight
from hpcpar.training.config import TrainConfig, check
from hpcpar.runtime import UsageError
from hpcpar.watch.why import diagnose, explain, rank_list

LAYOUT = {"tp": 2, "pp": 2, "dp": 2, "world": 8, "order": "tp-dp-pp"}   # rank = tp + 2 dp + 4 pp


def test_ring_keeps_the_last_operations_and_numbers_collectives_per_group():
    rec = flight.FlightRecorder(rank=3, size=4)
    rec.groups = {"tp": [2, 3], "pp": [3, 7]}
    rec.new_step(7)
    for _ in range(3):
        rec.end(rec.begin("all_reduce", "tp", None, 64, blocking=True))
    rec.at("SEND_F", 1)
    send = rec.begin("send", "pp", 1, 128, blocking=False)
    last = rec.begin("all_reduce", "tp", None, 64, blocking=True)
    ops = rec.entries()
    assert [e[flight.ID] for e in ops] == [1, 2, 3, 4]                # the oldest was overwritten
    assert [e[flight.SEQ] for e in ops] == [2, 3, None, 4]            # p2p has no group number
    snap = rec.snapshot("test")
    assert snap["rank"] == 3 and snap["step"] == 7 and snap["mb"] == 1
    sent = snap["ops"][2]
    assert sent["peer"] == 7 and sent["wait"] is None and sent["end"] is None   # a world rank, in flight
    assert snap["ops"][3]["wait"] is not None and snap["ops"][3]["end"] is None   # blocked in it
    rec.waiting(send)
    rec.end(send)
    assert send[flight.END] >= send[flight.WAIT] >= send[flight.START]
    assert last is ops[-1]


def test_records_are_written_whole_and_read_back(tmp_path):
    rec = flight.FlightRecorder(rank=5)
    path = flight.write_record(tmp_path / "flight", rec.snapshot("why not", {"layout": LAYOUT}))
    assert path.name == "rank-5.json" and not list(path.parent.glob(".*tmp"))
    assert flight.read_records(path.parent)[5]["reason"] == "why not"


def test_the_alarm_has_exactly_one_leader(tmp_path):
    assert not alarm.raised(tmp_path)
    assert alarm.claim(tmp_path, "rank 1") and not alarm.claim(tmp_path, "rank 2")
    assert alarm.raised(tmp_path)
    alarm.await_records(tmp_path, world=8, quiet=0.2)          # no record comes: returns after `quiet`


def test_rank_lists():
    assert rank_list([0, 1, 3, 4, 5, 6, 7]) == "0,1,3-7"
    assert rank_list([6, 2]) == "2,6"


def op(i, name, group, seq=None, peer=None, blocked=True, done=False):
    return {"id": i, "op": name, "group": group, "seq": seq, "peer": peer, "bytes": 8, "step": 49, "mb": 3,
            "start": 1.0, "wait": 1.0 if blocked else None, "end": 2.0 if done else None}


def record(rank, ops, groups, mb=3, reason=None, **extra):
    return {"rank": rank, "reason": reason, "time": 10.0 + rank, "step": 49, "mb": mb, "action": None,
            "phase": "step", "idle_s": 6.0, "groups": groups, "ops": ops, "layout": LAYOUT, **extra}


def stalled_rank_2():
    """Rank 2 (tp 0, pp 0, dp 1) stopped: its tp partner 3 waits in an all-reduce, its next stage 6
    in a receive from it, and the other ranks further down the chains."""
    world = {"world": list(range(8))}
    recs = {3: record(3, [op(1, "all_reduce", "tp", 1233, done=True, blocked=True), op(2, "all_reduce", "tp", 1234)],
                      {"tp": [2, 3], **world}, reason="no progress for 6.0 s (hang timeout 5 s)"),
            6: record(6, [op(9, "recv", "pp", peer=2)], {"pp": [2, 6], **world})}
    for r in (0, 1, 4, 5, 7):
        recs[r] = record(r, [op(4, "all_reduce", "world", 50)], world)
    return recs


def test_diagnosis_names_the_silent_rank_and_what_everyone_waits_on():
    text = diagnose(stalled_rank_2())
    assert text.startswith("rank 2 (tp 0, pp 0, dp 1) stopped in step 50, micro-batch 3, before its pp send "
                           "to rank 6 (it left no flight record);")
    assert "ranks 0,1,4,5,7 wait in the world all-reduce #50" in text
    assert "rank 3 waits in the tp all-reduce #1234" in text
    assert "rank 6 waits in the pp recv from rank 2 (micro-batch 3)" in text
    assert text.endswith("First to notice: rank 3, no progress for 6.0 s (hang timeout 5 s).")


def test_a_rank_that_waits_to_send_to_the_silent_one():
    recs = stalled_rank_2()
    recs[6]["ops"] = [op(9, "send", "pp", peer=2)]
    assert diagnose(recs).startswith("rank 2 (tp 0, pp 0, dp 1) stopped in step 50, micro-batch 3, before its pp "
                                     "recv from rank 6 (it left no flight record);")


def test_diagnosis_of_a_silent_rank_that_only_a_collective_waits_for():
    recs = stalled_rank_2()
    del recs[6]
    recs[7] = record(7, [op(4, "all_reduce", "world", 50)], {"world": list(range(8))})
    text = diagnose(recs, world=8)
    assert "rank 6 (tp 0, pp 1, dp 1) stopped in step 50, before the world all-reduce #50" in text
    assert "rank 2 (tp 0, pp 0, dp 1) stopped in step 50, before the tp all-reduce #1234" in text


def test_diagnosis_of_a_dead_rank():
    recs = stalled_rank_2()
    recs[2] = {"rank": 2, "dead": "was killed by signal 9 (SIGKILL)", "reason": None, "coords":
               {"tp": 0, "pp": 0, "dp": 1}, "step": 49, "mb": 3, "action": None, "phase": "step", "ops": []}
    text = diagnose(recs)
    assert text.startswith("rank 2 (tp 0, pp 0, dp 1) was killed by signal 9 (SIGKILL) in step 50, micro-batch 3;")
    alone = diagnose({2: recs[2]}, world=8)
    assert alone.endswith("; no other rank left a record")


def test_diagnosis_when_every_rank_answered():
    recs = stalled_rank_2()
    recs[2] = record(2, [op(1, "all_reduce", "tp", 1233, done=True)], {"tp": [2, 3]}, mb=3)
    recs[2]["action"] = "F"
    assert diagnose(recs).startswith("rank 2 (tp 0, pp 0, dp 1) is outside any recorded communication, in "
                                     "step 50, micro-batch 3 (F), for 6.0 s;")
    for r in range(8):                                          # everyone blocked: a deadlock
        recs[r] = record(r, [op(1, "barrier", "world", 7)], {"world": list(range(8))})
    assert diagnose(recs).startswith("every rank waits inside communication")


def test_explain_refuses_an_empty_directory(tmp_path):
    with pytest.raises(ValueError, match="no flight records"):
        explain(tmp_path)


@pytest.mark.parametrize("flag", ["hang_timeout", "shutdown_timeout"])
def test_negative_timeouts_are_refused(flag):
    with pytest.raises(UsageError, match=f"--{flag.replace('_', '-')} must not be negative"):
        check(TrainConfig(**{flag: -1.0}), 1)


@pytest.mark.mpi(min_size=2)
def test_communicator_calls_are_recorded(comm):
    from hpcpar.comm import Communicator, wait_all
    world = Communicator(comm, "world")
    rec = flight.install(flight.FlightRecorder(comm.rank))
    rec.groups["world"] = list(range(comm.size))
    left, right = (comm.rank - 1) % comm.size, (comm.rank + 1) % comm.size
    try:
        x, got = np.ones(4), np.empty(4)
        world.all_reduce_(x)
        world.all_reduce(x)
        wait_all([world.irecv_(got, left), world.isend(x, right)])
    finally:
        flight.uninstall()
    ops = rec.entries()
    assert [(e[flight.OP], e[flight.SEQ]) for e in ops] == [("all_reduce", 1), ("all_reduce", 2), ("recv", None),
                                                             ("send", None)]
    assert all(e[flight.WAIT] is not None and e[flight.END] is not None for e in ops)
    assert [op["peer"] for op in rec.snapshot("test")["ops"][2:]] == [left, right]


def test_the_deadline_follows_the_slowest_step_but_not_the_first():
    from hpcpar.comm.grid import Coord
    from hpcpar.watch.watchdog import Watchdog, flight_dir
    dog = Watchdog(0, 8, Coord(tp=0, pp=0, dp=0), LAYOUT, "flight", hang_timeout=10.0, shutdown_timeout=20.0,
                   stop_signals=())
    dog.step_done(0, 100.0)                 # the first step pays for start-up
    assert dog.deadline() == 10.0
    dog.step_done(1, 2.0)
    dog.step_done(2, 5.0)
    assert dog.deadline() == 15.0           # three times the slowest step
    assert flight_dir(TrainConfig(save="ck")) == "ck/flight" and flight_dir(TrainConfig()) == "./flight"
