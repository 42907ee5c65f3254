"""Tracing: where did each rank's time go?  Events -> one Chrome trace / Perfetto JSON for all ranks.

Each rank appends plain tuples to a list while it runs (no I/O, no formatting: about a microsecond per
event), on its tracks: "compute" (F/B/W of a micro-batch and chunk, the optimizer step, data loading)
"comm" (every collective through hpcpar.comm, waits for pipeline messages and for the DP buckets)
"dp" (each gradient bucket from its launch to the end of the wait: the overlap with backward) and
"cp" (each hop of ring attention's key/value blocks and their gradients, from posting to arrival, over
the attention blocks the compute track shows at the same time).
Pipeline messages also get flow arrows from the send to the matching receive.  At the end rank 0
gathers everything and writes {"traceEvents": [...]}: open it in https://ui.perfetto.dev or
chrome://tracing - one process per rank, named by its tp/pp/dp coordinates.  The reports read from
such a file afterwards are a tool (hpcpar/tools/trace/: summary, timeline plot, bubble).

The tracer is plain Python on the ground floor, so that the communicators (comm/), which report every
collective to it, stand on it rather than reach up to a tool.

Clocks: time.perf_counter is one system-wide monotonic clock on a node, so when every rank shares a node
(one host name) they all count from rank 0's zero, exactly; across nodes each rank's zero is the
moment it leaves a barrier, and ranks line up to within the barrier's skew.
"""
import json
import platform
import time
from contextlib import contextmanager

TRACKS = {"compute": 0, "comm": 1, "dp": 2, "cp": 3, "fsdp": 4}   # dp, cp: messages in flight, overlapping the
#                                                                  others; fsdp: ZeRO-3 units (data_parallel/fsdp.py)
_active = None


def active():
    """The tracer of this process, or None (every hook is then a single attribute check)."""
    return _active


class Tracer:
    def __init__(self, label, meta=None):
        self.label, self.meta = label, meta or {}
        self.events = []                 # (name, cat, track, start, end, args)
        self.flows = []                  # (id, "s" | "f", time, track)
        self.zero = time.perf_counter()
        self.enabled = True

    def span(self, name, cat, start, end, track="compute", **args):
        if self.enabled:
            self.events.append((name, cat, track, start, end, args or None))

    @contextmanager
    def region(self, name, cat, track="compute", **args):
        start = time.perf_counter()
        yield
        self.span(name, cat, start, time.perf_counter(), track, **args)

    def flow(self, key, phase, at, track="comm"):
        if self.enabled:
            self.flows.append((key, phase, at, track))


def start(label, comm=None, meta=None):
    """Switch tracing on for this process; collective over ``comm`` (which aligns the ranks' zeros).

    ``comm`` is any object with mpi4py's lower-case collectives and ``Barrier`` - passed in, never
    imported: the tracer sits below the communicators that report to it (docs/architecture.md)."""
    global _active
    _active = Tracer(label, meta)
    if comm is not None:
        one_node = len(set(comm.allgather(platform.node()))) == 1      # one clock for all of them
        comm.Barrier()
        _active.zero = time.perf_counter()
        if one_node:
            _active.zero = comm.bcast(_active.zero, root=0)
    return _active


def stop():
    global _active
    tracer, _active = _active, None
    return tracer


def add_engine_step(tracer, step, engine, rank_tag):
    """Turn one step's pipeline timeline into events, with flow ids that match across ranks."""
    t0 = engine.started
    for start, end, op, mb, chunk in engine.timeline:
        name = f"{op}{mb}" + (f".{chunk}" if chunk else "")
        if op in ("F", "B", "W"):
            tracer.span(name, op, t0 + start, t0 + end, "compute", step=step, mb=mb, chunk=chunk)
            continue
        tracer.span(name, "p2p", t0 + start, t0 + end, "comm", step=step, mb=mb, chunk=chunk)
        direction = "F" if op.endswith("F") else "B"
        stage = engine.stage(chunk)
        if op.startswith("SEND"):
            receiver = stage + (1 if direction == "F" else -1)
            tracer.flow(f"{step}.{direction}.{mb}.{receiver}.{rank_tag}", "s", t0 + start)
        else:
            tracer.flow(f"{step}.{direction}.{mb}.{stage}.{rank_tag}", "f", t0 + end)


def chrome_json(per_rank, meta):
    """All ranks' (label, zero, events, flows) -> the Chrome trace dict (times in microseconds)."""
    out = []
    ids = {}
    for pid, (label, zero, events, flows) in enumerate(per_rank):
        out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        for track, tid in TRACKS.items():
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}})
        for name, cat, track, start, end, args in events:
            ev = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": TRACKS[track],
                  "ts": round((start - zero) * 1e6, 3), "dur": round((end - start) * 1e6, 3)}
            if args:
                ev["args"] = args
            out.append(ev)
        for key, phase, at, track in flows:
            ev = {"ph": phase, "name": "message", "cat": "p2p", "pid": pid, "tid": TRACKS[track],
                  "ts": round((at - zero) * 1e6, 3), "id": ids.setdefault(key, len(ids))}
            if phase == "f":
                ev["bp"] = "e"
            out.append(ev)
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": meta}


def write(tracer, comm, path):
    """Collective: gather every rank's events to rank 0, which writes ``path``."""
    mine = (tracer.label, tracer.zero, tracer.events, tracer.flows)
    everyone = comm.gather(mine, root=0)        # once per run: a pickled gather is fine here
    if comm.rank == 0:
        with open(path, "w") as f:
            json.dump(chrome_json(everyone, tracer.meta), f)
