"""Reading a trace back: where each rank's time went, the measured bubble against the simulator's,
and the measured timeline drawn like ``hpcpar schedule --plot`` draws a simulated one.

    busy       time in F, B and W (the pipeline's work) during each step
    idle       this rank's share of its pipeline's step time not spent in F, B or W
    bubble     1 - busy / (p x makespan) per pipeline and step (pipeline/bubble.py): the simulator's measure
    comm       time inside collectives and waits for messages, as a share of the traced wall time
    overlap    share of the DP buckets' time in flight that coincides with compute (hidden traffic)
    optimizer  time in the optimizer step (the update - Muon's Newton-Schulz with its TP messages -, QK-clip,
               ZeRO's gathers), as a share of the traced wall time
"""
import json
import re
import statistics
from collections import defaultdict

from hpcpar.pipeline.bubble import pipeline_bubble, simulated_bubble


def load(path):
    with open(path) as f:
        data = json.load(f)
    names, spans = {}, defaultdict(list)
    for ev in data["traceEvents"]:
        if ev["ph"] == "M" and ev["name"] == "process_name":
            names[ev["pid"]] = ev["args"]["name"]
        elif ev["ph"] == "X":
            spans[ev["pid"]].append(ev)
    return data.get("otherData", {}), names, spans


def _union(intervals):
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _overlap(intervals, others):
    """Length of the parts of ``intervals`` covered by ``others``."""
    covered = 0.0
    for a, b in intervals:
        covered += _union([(max(a, c), min(b, d)) for c, d in others if min(b, d) > max(a, c)])
    return covered


def windows(spans, names):
    """(tp, dp, step, start, end, busy) of every rank's traced steps, for pipeline_bubble."""
    out = []
    for pid, evs in spans.items():
        coords = re.search(r"tp(\d+)\.(?:cp(\d+)\.)?pp\d+\.dp(\d+)", names.get(pid, ""))
        # one pipeline per (tp, cp, dp): the (dp, cp) pair keys it when there is a cp axis
        tp, dp = (int(coords[1]), int(coords[3]) if coords[2] is None else (int(coords[3]), int(coords[2]))) \
            if coords else (0, pid)
        steps = defaultdict(list)
        for e in evs:
            if e.get("args", {}).get("step") is not None:
                steps[e["args"]["step"]].append(e)
        for step, es in steps.items():
            busy = sum(e["dur"] for e in es if e["cat"] in ("F", "B", "W"))
            out.append((tp, dp, step, min(e["ts"] for e in es), max(e["ts"] + e["dur"] for e in es), busy))
    return out


def per_rank(spans, names):
    """{pid: figures} for every rank of the trace."""
    out = {}
    bounds = defaultdict(list)                 # the pipeline's step windows: (tp, dp, step) -> [(start, end)]
    for tp, dp, step, start, end, _ in windows(spans, names):
        bounds[(tp, dp, step)].append((start, end))
    for pid, evs in spans.items():
        work = [e for e in evs if e["cat"] in ("F", "B", "W")]
        mine = windows({pid: evs}, names)
        step_time = sum(max(e for _, e in bounds[w[:3]]) - min(s for s, _ in bounds[w[:3]]) for w in mine)
        busy = sum(e["dur"] for e in work)
        wall = max(e["ts"] + e["dur"] for e in evs) - min(e["ts"] for e in evs)
        comm = _union([(e["ts"], e["ts"] + e["dur"]) for e in evs if e["tid"] == 1])
        flight = [(e["ts"], e["ts"] + e["dur"]) for e in evs if e["cat"] == "dp-overlap"]
        compute = [(e["ts"], e["ts"] + e["dur"]) for e in evs if e["tid"] == 0]
        out[pid] = {"busy_us": busy, "step_us": step_time, "wall_us": wall, "comm_us": comm,
                    "optimizer_us": sum(e["dur"] for e in evs if e["cat"] == "optimizer"),
                    "idle": 1 - busy / step_time if step_time else 0.0,
                    "overlap": _overlap(flight, compute) / sum(b - a for a, b in flight) if flight else None,
                    "costs": {op: [e["dur"] for e in work if e["cat"] == op] for op in ("F", "B", "W")},
                    "steps": len(mine)}
    return out


def grid_name(meta):
    """'tp 2 x pp 2 x dp 2', with 'cp N x' after tp when the run had a context-parallel axis."""
    cp = f"cp {meta['cp']} x " if meta.get("cp", 1) > 1 else ""
    return f"tp {meta.get('tp')} x {cp}pp {meta.get('pp')} x dp {meta.get('dp')}"


def simulated(meta, figures):
    """The simulator's bubble for the run's own schedule, as the run recorded it (its CSV order: a
    --schedule-file run has no name to rebuild it by); a trace written before that, by name."""
    from hpcpar.pipeline.csv_format import loads
    from hpcpar.pipeline.schedules import build
    if not meta.get("schedule") or meta.get("stages", 1) == 1:
        return 0.0
    mean = {op: statistics.fmean([d for f in figures.values() for d in f["costs"][op]] or [0.0])
            for op in ("F", "B", "W")}
    if meta.get("schedule_csv"):
        schedule = loads(meta["schedule_csv"], meta["schedule"])
    else:
        schedule = build(meta["schedule"], meta["stages"], meta["microbatches"], meta.get("chunks", 1))
    return simulated_bubble(schedule, mean)


def summary(path):
    meta, names, spans = load(path)
    figures = per_rank(spans, names)
    lines = [f"{path}: {len(figures)} ranks, {meta.get('schedule', '?')} schedule, {grid_name(meta)}, "
             f"{max(f['steps'] for f in figures.values())} steps traced",
             f"{'rank':<26} {'busy ms':>9} {'idle':>6} {'comm':>6} {'overlap':>8}"]
    for pid in sorted(figures):
        f = figures[pid]
        ov = "-" if f["overlap"] is None else f"{f['overlap']:.0%}"
        lines.append(f"{names.get(pid, pid):<26} {f['busy_us'] / 1e3:>9.1f} {f['idle']:>6.1%} "
                     f"{f['comm_us'] / f['wall_us']:>6.1%} {ov:>8}")
    bubble = pipeline_bubble(windows(spans, names))
    comm = statistics.fmean(f["comm_us"] / f["wall_us"] for f in figures.values())
    overlaps = [f["overlap"] for f in figures.values() if f["overlap"] is not None]
    optimizer = statistics.fmean(f["optimizer_us"] / f["wall_us"] for f in figures.values())
    lines += [f"bubble    measured {bubble:.1%} of pipeline time idle; simulated {simulated(meta, figures):.1%} "
              "for the measured mean F, B, W",
              f"comm      {comm:.1%} of wall time inside communication (mean over ranks)",
              f"optimizer {optimizer:.1%} of wall time in the optimizer step (mean over ranks)"]
    if overlaps:
        lines.append(f"overlap   {statistics.fmean(overlaps):.0%} of the DP buckets' time in flight hidden "
                     "behind compute")
    return "\n".join(lines)


def _annotations(spans, names, pids, zero, end, flows):
    """The thin communication lane of each row, the pipeline messages' arrows, and three notes: the first
    TP all-reduce, the first pipeline send, the largest idle gap (the bubble)."""
    row = {pid: i for i, pid in enumerate(pids)}
    lanes = [[((e["ts"] - zero) / 1e3, (e["ts"] + e["dur"] - zero) / 1e3) for e in spans[pid]
              if e["cat"] in ("collective", "p2p") and zero <= e["ts"] <= zero + end * 1e3] for pid in pids]
    notes = []
    tp = [(e["ts"], pid) for pid in pids for e in spans[pid] if e["name"] == "tp all_reduce" and zero <= e["ts"]]
    if tp:
        ts, pid = min(tp)
        notes.append(((ts - zero) / 1e3, row[pid] + 0.32, "TP all-reduce"))
    starts = {k: (pid, ts) for k, ph, pid, ts in flows if ph == "s" and zero <= ts <= zero + end * 1e3}
    arrows = [((ts - zero) / 1e3, row[pid], (te - zero) / 1e3, row[pe])
              for k, ph, pe, te in flows if ph == "f" and k in starts for pid, ts in [starts[k]]]
    if arrows:
        x0, y0, x1, y1 = min(arrows)
        notes.append((x0, y0, "pipeline send: the arrow ends at its receive"))
    return lanes, arrows, notes


def _largest_gap(rows, end):
    """(middle, row) of the longest stretch in which one row computes nothing, the step's ends included,
    among those in the left 60 % of the step: a note's text runs to the right of what it points at, and
    from further right it would run into the legend."""
    best = (0.0, 0.0, 0)
    for y, boxes in enumerate(rows):
        edges = [0.0] + [t for a, b, *_ in sorted(boxes) for t in (a, b)] + [end]
        for a, b in zip(edges[::2], edges[1::2]):
            if (a + b) / 2 <= 0.6 * end:
                best = max(best, (b - a, (a + b) / 2, y))
    return best[1], best[2]


def _apart(notes):
    """The notes with their points moved up or down inside the box they point at (at most 0.38 of a row)
    until no two texts share a level: plot_timeline writes note i's text 0.55 + 0.3 (i mod 2) rows above
    its point, and two texts less than 0.4 rows apart overlap."""
    placed, levels = [], []
    for i, (x, y, text) in enumerate(notes):
        for shift in (0.0, -0.1, -0.2, -0.3, -0.38, 0.1, 0.2, 0.3, 0.38):
            level = y + shift - 0.55 - 0.3 * (i % 2)
            if all(abs(level - other) >= 0.4 for other in levels):
                break
        else:
            shift, level = 0.0, y - 0.55 - 0.3 * (i % 2)
        placed.append((x, y + shift, text))
        levels.append(level)
    return placed


def plot(path, out, step=None, annotate=False):
    """The measured F/B/W timeline of one traced step (default: the last), one row per rank; with
    ``annotate``, the communication lanes, the pipeline messages and notes on what to find."""
    from hpcpar.pipeline.plot import plot_timeline
    meta, names, spans = load(path)
    traced = sorted({e["args"]["step"] for evs in spans.values() for e in evs if "step" in e.get("args", {})})
    step = traced[-1] if step is None else step
    if step not in traced:
        raise ValueError(f"step {step} is not in the trace (traced: {traced[0]}..{traced[-1]})")
    pids = sorted(spans)
    work = {pid: [e for e in spans[pid] if e["cat"] in ("F", "B", "W") and e["args"]["step"] == step]
            for pid in pids}
    zero = min(e["ts"] for es in work.values() for e in es)
    rows = [[((e["ts"] - zero) / 1e3, (e["ts"] + e["dur"] - zero) / 1e3, e["cat"], e["args"]["mb"],
              e["args"]["chunk"]) for e in work[pid]] for pid in pids]
    extra = {}
    if annotate:
        end = max(b for r in rows for _, b, *_ in r)
        lanes, arrows, notes = _annotations(spans, names, pids, zero, end, flows(path))
        x, y = _largest_gap(rows, end)
        extra = dict(lanes=lanes, arrows=arrows, notes=_apart(notes + [(x, y, "idle: part of the bubble")]))
    plot_timeline(rows, out, title=f"measured step {step}: {meta.get('schedule')} {grid_name(meta)}", unit_label="ms",
                  labels=[names.get(pid, str(pid)) for pid in pids], **extra)
    return out


def flows(path):
    """(id, "s" | "f", pid, ts) of the flow events: a pipeline message's send and its receive."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return [(e["id"], e["ph"], e["pid"], e["ts"]) for e in events if e.get("ph") in ("s", "f")]
