"""ZeRO-3's gather/free timeline of one traced step, as a PNG (``hpcpar trace plot FILE --zero``).

One row per rank, three lanes: above, each unit's all-gather from its post to the end of its wait
(the part a module waited for drawn over it in red); in the middle, each module's forward (F) and
backward (B) compute, numbered by unit, with a black tick where a unit's gathered values are freed;
below, each unit's reduce-scatter from its post until the rank sees it complete.  The spans come from
the ``fsdp`` track that data_parallel/fsdp.py writes under ``--trace``.
"""
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from hpcpar.tools.trace.report import grid_name, load

COLOURS = {"F": "#4c72b0", "B": "#55a868", "all-gather": "#dd8452", "reduce-scatter": "#8172b3",
           "wait": "#c44e52"}
LANE = {"all-gather": -0.3, "F": 0.0, "B": 0.0, "reduce-scatter": 0.3}


def _step_spans(spans, step):
    """Per rank, the fsdp spans and gather waits that start inside the rank's F/B/W of ``step``."""
    out = {}
    for pid, evs in spans.items():
        work = [e for e in evs if e["cat"] in ("F", "B", "W") and e.get("args", {}).get("step") == step]
        lo, hi = min(e["ts"] for e in work), max(e["ts"] + e["dur"] for e in work)
        out[pid] = [e for e in evs if lo <= e["ts"] <= hi and
                    (e["cat"] == "fsdp" or e["name"] == "fsdp gather wait")]
    return out


def plot_zero(path, out, step=None):
    """Write the timeline of ``step`` (default: the last traced) of a ZeRO-3 trace to the PNG ``out``."""
    meta, names, spans = load(path)
    traced = sorted({e["args"]["step"] for evs in spans.values() for e in evs if "step" in e.get("args", {})})
    step = traced[-1] if step is None else step
    if step not in traced:
        raise ValueError(f"step {step} is not in the trace (traced: {traced[0]}..{traced[-1]})")
    rows = _step_spans(spans, step)
    if not any(e["cat"] == "fsdp" for evs in rows.values() for e in evs):
        raise ValueError("no ZeRO-3 spans in it: trace a run with --zero 3")
    pids = sorted(rows)
    zero = min(e["ts"] for evs in rows.values() for e in evs)
    end = max(e["ts"] + e["dur"] - zero for evs in rows.values() for e in evs) / 1e3
    fig = Figure(figsize=(12, 1.2 * len(pids) + 1.2))
    ax = fig.add_subplot()
    for y, pid in enumerate(pids):
        for e in rows[pid]:
            start, dur = (e["ts"] - zero) / 1e3, e["dur"] / 1e3
            if e["name"] == "fsdp gather wait":
                ax.barh(y + LANE["all-gather"], dur, left=start, height=0.2, color=COLOURS["wait"], zorder=3)
                continue
            what, units = e["name"].rsplit(" ", 1)
            if what == "free":
                ax.plot([start, start], [y - 0.2, y + 0.2], color="black", lw=1.5, zorder=3)
                continue
            height = 0.36 if what in ("F", "B") else 0.2
            ax.barh(y + LANE[what], dur, left=start, height=height, color=COLOURS[what], alpha=0.85,
                    edgecolor="white", linewidth=0.5)
            if dur > end / 150:
                ax.text(start + dur / 2, y + LANE[what], units, ha="center", va="center", fontsize=7,
                        color="white" if what in ("F", "B") else "black")
    ax.set_yticks(range(len(pids)), [names.get(pid, str(pid)) for pid in pids])
    ax.set_ylim(len(pids) - 0.5, -0.5)
    ax.set_xlim(0, end)
    ax.set_xlabel("ms")
    ax.set_title(f"ZeRO-3, measured step {step}, {grid_name(meta)}: units numbered in module order", fontsize=10)
    legend = [Patch(color=COLOURS[k], label=label) for k, label in (
        ("all-gather", "all-gather, post to wait (top)"), ("wait", "waited for it"), ("F", "forward of a unit"),
        ("B", "backward of a unit"), ("reduce-scatter", "reduce-scatter (bottom)"))]
    legend.append(Patch(color="black", label="| free of the gathered unit"))
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out
