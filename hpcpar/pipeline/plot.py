"""Draw a timeline: one row per device, one box per action, as a PNG (matplotlib, no display needed).

The input is plain data, so the same picture serves the simulator (``SimResult.rows()``) and
timelines measured by the engine: per row, a list of ``(start, end, op, mb, chunk)``.  Forward,
backward and weight-gradient boxes get their own colour, anything else (send, recv, allreduce ...)
is grey; a later chunk of the same rank is drawn lighter; the micro-batch number is written inside.
Measured timelines may add a thin lane of communication spans under each row, arrows from a send to
its receive, and notes that point at one thing each (``hpcpar trace plot --annotate``).
"""
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

COLOURS = {"F": "#4c72b0", "B": "#55a868", "W": "#dd8452"}
OTHER = "#9a9a9a"
NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}


def _shade(colour, chunk, chunks):
    """Chunk 0 in full colour, later chunks mixed with white (up to 60%)."""
    mix = 0.6 * chunk / max(chunks - 1, 1)
    return tuple(c + (1 - c) * mix for c in to_rgb(colour))


def plot_timeline(rows, path, title="", unit_label="time units", labels=None, lanes=None, arrows=(), notes=()):
    """Write the timeline of ``rows`` to the PNG ``path``; ``labels`` names the rows (default
    "dev 0", "dev 1", ...; e.g. "rank 5 tp1.pp1.dp0" for a measured run).  ``lanes``: per row,
    (start, end) spans drawn thin and dark below the row's boxes; ``arrows``: (x0, row0, x1, row1);
    ``notes``: (x, row, text), each written beside an arrow that points at (x, row)."""
    labels = labels or [f"dev {r}" for r in range(len(rows))]
    boxes = [box for row in rows for box in row]
    end = max((box[1] for box in boxes), default=1.0)
    chunks = 1 + max((box[4] or 0 for box in boxes), default=0)
    # about 0.3 inch per shortest box (plus 2.5 inches of labels and legend)
    span = min((b - a for a, b, *_ in boxes if b > a), default=end)
    fig = Figure(figsize=(min(max(6.0, 0.3 * end / span + 2.5), 24), 0.45 * len(rows) + 1.4))
    ax = fig.add_subplot()
    digits = max((len(str(box[3])) for box in boxes), default=1)
    box_points = (fig.get_figwidth() - 2.5) * 72 * span / end     # the shortest box, in points
    font = max(4.0, min(9.0, box_points / (0.6 * digits + 0.6)))   # a digit is ~0.6 font size wide
    for y, row in enumerate(rows):
        for start, stop, op, mb, chunk in row:
            colour = _shade(COLOURS.get(op, OTHER), chunk or 0, chunks)
            ax.barh(y, stop - start, left=start, height=0.8, color=colour, edgecolor="white",
                    linewidth=0.6)
            if mb is not None and stop > start:
                ax.text((start + stop) / 2, y, str(mb), ha="center", va="center", fontsize=font,
                        color="white" if chunk == 0 and op in COLOURS else "black")
    for y, lane in enumerate(lanes or []):
        for start, stop in lane:
            ax.barh(y + 0.32, max(stop - start, end / 2000), left=start, height=0.16, color="#333333")
    for x0, y0, x1, y1 in arrows:
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops=dict(arrowstyle="->", color="#c44e52", lw=1.2))
    for i, (x, y, text) in enumerate(notes):
        ax.annotate(text, xy=(x, y), xytext=(x + 0.04 * end, y - 0.55 - 0.3 * (i % 2)), fontsize=8,
                    color="#c44e52", arrowprops=dict(arrowstyle="->", color="#c44e52", lw=1),
                    bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="#c44e52", lw=0.6))
    ax.set_yticks(range(len(rows)), labels)
    if lanes or notes:                 # room for the lanes below the rows and the notes above them
        ax.set_ylim(len(rows) - 0.3, -1.4 if notes else -0.6)       # top < bottom: device 0 on top
    else:
        ax.invert_yaxis()              # device 0 on top, like the ASCII timeline
    ax.set_xlim(0, end)
    ax.set_xlabel(unit_label)
    ax.set_title(title, fontsize=10)
    present = {box[2] for box in boxes}
    legend = [Patch(color=c, label=NAMES[op]) for op, c in COLOURS.items() if op in present]
    if present - set(COLOURS):
        legend.append(Patch(color=OTHER, label=", ".join(sorted(present - set(COLOURS)))))
    if lanes and any(lanes):
        legend.append(Patch(color="#333333", label="communication (thin lane)"))
    if chunks > 1:
        legend.append(Patch(color=_shade(OTHER, chunks - 1, chunks), label="lighter: later chunk"))
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
