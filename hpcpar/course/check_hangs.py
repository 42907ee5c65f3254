"""Hang-debugging exercise: from the flight records of a stuck job, the culprits and what every other
rank waits in (hpcpar/comm/flight.py writes the records, hpcpar/watch/why.py reads them)."""
from hpcpar.course.wrong import Wrong
from hpcpar.watch.why import blocked_in


def hang_diagnosis(records, world):
    """Reference: (culprits, waits).  culprits: the ranks with no record or a dead one; when every rank
    answered, those not inside any communication.  waits: {rank: (group, op, seq for a collective or the
    peer rank for a send/recv)} of every live rank blocked in an operation - the oldest one it waits on."""
    alive = {r: rec for r, rec in records.items() if not rec.get("dead")}
    waiting = {r: blocked_in(rec) for r, rec in alive.items() if blocked_in(rec)}
    culprits = sorted(r for r in range(world) if r not in alive) or sorted(set(alive) - set(waiting))
    return culprits, {r: (op["group"], op["op"], op["seq"] if op["peer"] is None else op["peer"])
                      for r, op in sorted(waiting.items())}


def _op(i, name, group, seq=None, peer=None, waited=True, done=False):
    return {"id": i, "op": name, "group": group, "seq": seq, "peer": peer, "bytes": 8, "step": 49, "mb": 3,
            "start": 1.0 + i, "wait": 1.0 + i if waited else None, "end": 2.0 + i if done else None}


def _record(rank, ops, groups):
    return {"rank": rank, "step": 49, "mb": 3, "action": None, "phase": "step", "idle_s": 6.0,
            "groups": groups, "ops": ops}


def cases():
    """Flight records of 8-rank jobs (tp 2 x pp 2 x dp 2, order tp-dp-pp), one situation each."""
    world = {"world": list(range(8))}
    silent = {3: _record(3, [_op(1, "all_reduce", "tp", 1233, done=True), _op(2, "all_reduce", "tp", 1234)],
                         {"tp": [2, 3], **world}),
              6: _record(6, [_op(9, "recv", "pp", peer=2)], {"pp": [2, 6], **world})}
    for r in (0, 1, 4, 5, 7):
        silent[r] = _record(r, [_op(4, "all_reduce", "world", 50)], world)
    dead = dict(silent)
    dead[2] = {"rank": 2, "dead": "was killed by signal 9 (SIGKILL)", "step": 49, "mb": 3, "ops": []}
    computing = dict(silent)
    computing[2] = _record(2, [_op(1, "all_reduce", "tp", 1233, done=True)], {"tp": [2, 3], **world})
    posted = {r: _record(r, [_op(1, "send", "pp", peer=r ^ 4, waited=False), _op(2, "all_reduce", "dp", 7),
                             _op(3, "recv", "pp", peer=r ^ 4)], {"dp": [r, r ^ 2], **world})
              for r in range(8) if r != 5}
    late = {r: rec for r, rec in computing.items() if r != 2}          # rank 2 silent, rank 7 still computing
    late[7] = _record(7, [_op(4, "all_reduce", "world", 49, done=True)], world)
    deadlock = {r: _record(r, [_op(1, "send", "pp", peer=r ^ 4)], world) for r in range(8)}
    return [("rank 2 left no record", silent), ("rank 2 died", dead), ("rank 2 computes", computing),
            ("rank 5 left no record; the others posted a send they never waited for", posted),
            ("rank 2 left no record; rank 7 has not reached the all-reduce yet", late),
            ("every rank blocks in a send", deadlock)]


def check_hang_diagnosis(f):
    for what, records in cases():
        culprits, waits = f({r: dict(rec) for r, rec in records.items()}, 8)
        want_culprits, want_waits = hang_diagnosis(records, 8)
        if sorted(culprits) != want_culprits:
            raise Wrong(f"{what}: you name {sorted(culprits)} as the culprits; look again at which ranks "
                        "the others wait for")
        waits = {int(r): tuple(w) for r, w in waits.items()}
        for r in sorted(set(waits) | set(want_waits)):
            if waits.get(r) != want_waits.get(r):
                raise Wrong(f"{what}: rank {r} waits in {want_waits[r]}, not {waits.get(r)}" if r in want_waits
                            else f"{what}: rank {r} waits in nothing (it is a culprit, or every operation of it "
                                 f"finished or was never waited for), not {waits[r]}")
