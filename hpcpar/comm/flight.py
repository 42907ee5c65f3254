"""The flight recorder: each rank's last N communication operations, kept for the moment a job hangs.

Every call through hpcpar.comm appends one entry to a ring buffer of fixed size (a list of N slots,
overwritten in turn: no allocation grows, nothing is written to disk while the job is healthy):

    id      number of the operation on this rank (0, 1, 2, ...)
    op      all_reduce, all_gather, reduce_scatter, all_to_all, all_to_allv, bcast, barrier, send, recv (a
            sendrecv: its receive)
    group   the communicator's name (tp, pp, dp, mp, embed, world)
    seq     collectives only: the how-manieth collective on that group (1, 2, ...).  Every member of a
            group calls its collectives in the same order, so "tp all-reduce #1234" is one and the
            same operation on every member - a member whose last tp collective is #1233 has not
            arrived yet.
    peer    point-to-point only: the other rank, numbered inside the group
    bytes   payload handed to MPI
    step, mb  where the training loop was (mb: the micro-batch of the pipeline action, or None)
    start   when the operation was called or posted (time.monotonic)
    wait    when this rank began to block on it (a blocking call: = start; a non-blocking one: the
            wait() of its request; None while it merely runs in the background)
    end     when it completed (None: still in flight)

The recorder also holds the *heartbeat* (``beat``: the time of the last progress of any kind) that the
watchdog compares with its deadline, and where the loop is (step, micro-batch, action, phase).  An entry
costs a list of eleven items and two clock reads: about a microsecond (``make bench`` measures it).

``dump`` writes everything as ``rank-N.json`` (atomically); hpcpar/watch/why.py reads those files.
"""
import json
import os
import socket
import time
from pathlib import Path

ID, OP, GROUP, SEQ, PEER, BYTES, STEP, MB, START, WAIT, END = range(11)
FIELDS = ("id", "op", "group", "seq", "peer", "bytes", "step", "mb", "start", "wait", "end")
_active = None


def active():
    """This process's recorder, or None (every hook is then a single global read)."""
    return _active


def install(recorder):
    global _active
    _active = recorder
    return recorder


def uninstall():
    global _active
    _active = None


class FlightRecorder:
    """A ring buffer of this rank's last ``size`` communication operations, and its progress."""

    def __init__(self, rank, size=256):
        self.rank, self.size = rank, size
        self.ring = [None] * size
        self.count = 0                  # operations recorded so far (the next entry's id)
        self.seq = {}                   # group name -> collectives called on it so far
        self.groups = {}                # group name -> world ranks of its members, in group order
        self.step, self.mb, self.action, self.phase = -1, None, None, "start"
        self.beat = time.monotonic()
        self.mirror = None              # the rank guard's shared page (hpcpar/watch/rank_guard.py), if any

    # --- the hot path: one call per operation ---------------------------------------------------

    def begin(self, op, group, peer, nbytes, blocking):
        """A new entry for an operation that starts now; a blocking call blocks from the start."""
        now = self.beat = time.monotonic()
        seq = None
        if peer is None:
            seq = self.seq[group] = self.seq.get(group, 0) + 1
        entry = [self.count, op, group, seq, peer, nbytes, self.step, self.mb, now,
                 now if blocking else None, None]
        self.ring[self.count % self.size] = entry
        self.count += 1
        return entry

    def waiting(self, entry):
        """This rank now blocks until ``entry`` completes (the wait of a non-blocking operation)."""
        entry[WAIT] = time.monotonic()

    def end(self, entry):
        entry[END] = self.beat = time.monotonic()

    def at(self, action=None, mb=None):
        """The loop or the pipeline engine moved on (an F/B/W/SEND/RECV of micro-batch ``mb``)."""
        self.action, self.mb = action, mb
        self.beat = time.monotonic()
        if self.mirror is not None:
            self.mirror.set_progress(self.step, mb)

    def new_step(self, step):
        self.step, self.mb, self.action, self.phase = step, None, None, "step"
        self.beat = time.monotonic()
        if self.mirror is not None:
            self.mirror.set_progress(step, None)

    def enter(self, phase):
        """A phase of the loop outside the steps: "checkpoint", "summary", ..."""
        self.phase, self.action, self.mb = phase, None, None
        self.beat = time.monotonic()

    # --- reading it ------------------------------------------------------------------------------

    def entries(self):
        """The recorded operations, oldest first."""
        first = max(0, self.count - self.size)
        return [self.ring[i % self.size] for i in range(first, self.count)]

    def snapshot(self, reason, extra=None):
        """Everything as one JSON-ready dict; times in seconds of the wall clock (time.time)."""
        now_mono, now_wall = time.monotonic(), time.time()
        wall = lambda t: None if t is None else round(now_wall - (now_mono - t), 6)  # noqa: E731
        ops = []
        for e in self.entries():
            d = dict(zip(FIELDS, e))
            d["start"], d["wait"], d["end"] = wall(e[START]), wall(e[WAIT]), wall(e[END])
            if d["peer"] is not None and e[GROUP] in self.groups:
                d["peer"] = self.groups[e[GROUP]][e[PEER]]           # as a world rank
            ops.append(d)
        return {"rank": self.rank, "reason": reason, "time": round(now_wall, 6), "host": socket.gethostname(),
                "pid": os.getpid(), "step": self.step, "mb": self.mb, "action": self.action,
                "phase": self.phase, "idle_s": round(now_mono - self.beat, 3), "groups": self.groups,
                "ops": ops, **(extra or {})}


def write_record(directory, record):
    """Write one rank's record as <directory>/rank-N.json, atomically (a reader never sees half a file)."""
    path = Path(directory) / f"rank-{record['rank']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return path


def read_records(directory):
    """{rank: record} of every rank-N.json in ``directory``."""
    out = {}
    for path in sorted(Path(directory).glob("rank-*.json")):
        record = json.loads(path.read_text())
        out[int(record["rank"])] = record
    return out
