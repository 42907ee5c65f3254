"""From the stored results of a sweep to its figures: a CSV, a table and five PNG plots.

Every figure comes from one run's ``hpcpar train --summary-json`` (results/*.json, sweep.py); where
a point ran more than once (``--repeat``, or a later sweep into the same directory), from its fastest
run - on a shared machine, the one least disturbed by other jobs:

* time per step: the median over the timed steps (the first step, start-up, is left out);
* tokens/s: tokens per step / time per step;
* speedup: tokens/s against the smallest rank count of the same series.  In strong scaling the tokens
  per step stay fixed, so this is the classic T(N0) / T(N); in weak scaling they grow with the ranks,
  so it is the *scaled* speedup N/N0 x T(N0) / T(N).  Ideal: N / N0 in both;
* efficiency: speedup / (N / N0); ideal 1;
* serial fraction (Karp-Flatt): the share e of the work that Amdahl's law would need to be serial to
  explain the measured speedup S on n = N / N0 times the ranks, e = (1/S - 1/n) / (1 - 1/n); ideal 0.
  A constant e over n points to work that does not parallelise; a growing e, to an overhead that grows
  with the ranks (communication, waiting);
* outside F/B/W: the share of the step in which a rank, on average, is not running a forward,
  backward or weight-gradient action: 1 - (F + B + W) x micro-batches x chunks / time per step, with
  the mean action times of the summary's ``costs_s``.  It holds pipeline waits (bubble), the data-parallel
  gradient all-reduce that is not hidden, the optimizer step and Python overhead.  Tensor-parallel
  all-reduces happen *inside* forward and backward, so they count as compute here - and so does the
  time a rank waits for a core when ranks outnumber cores;
* bytes per rank: the summary's ``bytes_per_step`` (the payload each kind of group handed to MPI, all ranks
  together) / ranks: the volume, not its time.

Plots are drawn with matplotlib's Agg renderer (``Figure`` without pyplot: no display needed).
"""
import csv
import json
from pathlib import Path

from hpcpar.tools.plan.layout import Layout
from hpcpar.runtime import UsageError
from hpcpar.tools.scaling import layouts

GROUPS = ("tp", "pp", "dp", "embed", "world")
COLUMNS = ("mode", "series", "ranks", "layout", "tp", "pp", "dp", "batch_size", "runs", "exit_status", "step_time_s",
           "tokens_per_s", "speedup", "efficiency", "serial_fraction", "compute_share", "outside_share", "bytes_per_rank",
           *(f"bytes_{g}" for g in GROUPS), "bubble_measured", "bubble_simulated", "mfu", "loss", "wall_s")
PLOTS = ("time_per_step.png", "speedup.png", "efficiency.png", "tokens_per_s.png", "communication.png")


def load(directory):
    """Every result record in DIR/results."""
    files = sorted((Path(directory) / "results").glob("*.json"))
    if not files:
        raise UsageError(f"no results in {Path(directory) / 'results'}: run hpcpar scaling --out {directory} first")
    records = []
    for f in files:
        try:
            records.append(json.loads(f.read_text()))
        except (OSError, ValueError) as err:
            raise UsageError(f"{f}: not a scaling result ({err})") from None
    return records


def _row(record):
    """One CSV row: the point, and its figures when it ran to the end."""
    lay, s = record["layout"], record.get("summary")
    row = dict.fromkeys(COLUMNS)
    row.update(mode=record["mode"], series=record["series"], ranks=record["ranks"],
               layout=layouts.label(Layout(**lay)), **lay, batch_size=record["batch_size"],
               exit_status="timeout" if record.get("timed_out") else record["exit_status"],
               wall_s=record["wall_s"], model=record.get("model"), steps=record.get("steps"),
               host_cpus=record.get("host_cpus"), nodes=record.get("nodes", 1))
    if s:
        step = s["step_time_s"]
        compute = sum(s.get("costs_s", {}).values()) * record["microbatches"] * record["chunks"]
        volume = s.get("bytes_per_step", {})
        row.update(step_time_s=step, tokens_per_s=s["tokens_per_s"], compute_share=min(1.0, compute / step),
                   bytes_per_rank=sum(volume.values()) / record["ranks"], loss=s.get("loss"), mfu=s.get("mfu"),
                   bubble_measured=s.get("bubble_measured"), bubble_simulated=s.get("bubble_simulated"))
        row["outside_share"] = 1.0 - row["compute_share"]
        row.update({f"bytes_{g}": volume.get(g, 0.0) for g in GROUPS})
    return row


def _fastest(rows):
    """One row per point: its fastest run that finished (else its last run), with the count of runs."""
    points = {}
    for row in rows:
        points.setdefault((row["mode"], row["series"], row["ranks"]), []).append(row)
    best = []
    for key in sorted(points):
        done = [r for r in points[key] if r["step_time_s"] is not None]
        row = min(done, key=lambda r: r["step_time_s"]) if done else points[key][-1]
        best.append(dict(row, runs=len(points[key])))
    return best


def karp_flatt(speedup, growth):
    """Serial fraction e implied by ``speedup`` on ``growth`` = N / N0 times the ranks:
    Amdahl's S = 1 / (e + (1 - e)/n) solved for e.  None at n = 1, where every e fits."""
    if growth <= 1:
        return None
    return (1 / speedup - 1 / growth) / (1 - 1 / growth)


def derive(records):
    """One row per point (mode, series, ranks), with speedup and efficiency against the smallest rank
    count that ran in the same mode and series."""
    rows = _fastest([_row(r) for r in records])
    base = {}
    for row in rows:
        if row["tokens_per_s"] is not None:
            base.setdefault((row["mode"], row["series"]), row)
    for row in rows:
        if row["tokens_per_s"] is not None:
            b = base[(row["mode"], row["series"])]
            row["speedup"] = row["tokens_per_s"] / b["tokens_per_s"]
            row["efficiency"] = row["speedup"] / (row["ranks"] / b["ranks"])
            row["serial_fraction"] = karp_flatt(row["speedup"], row["ranks"] / b["ranks"])
    return rows


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def table(rows):
    head = (f"{'mode':6s} {'series':>12s} {'ranks':>5s}  {'layout':12s} {'runs':>4s} {'ms/step':>9s} {'tokens/s':>10s} "
            f"{'speedup':>7s} {'effic.':>6s} {'serial':>6s} {'outside F/B/W':>13s} {'MB/rank/step':>12s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        start = f"{r['mode']:6s} {r['series']:>12s} {r['ranks']:>5d}  {r['layout']:12s} {r['runs']:>4d} "
        if r["step_time_s"] is None:
            lines.append(start + f"failed: exit status {r['exit_status']}")
            continue
        serial = "-" if r["serial_fraction"] is None else f"{r['serial_fraction']:.3f}"
        lines.append(start + f"{r['step_time_s'] * 1e3:9.1f} {r['tokens_per_s']:10,.0f} {r['speedup']:7.2f} "
                     f"{r['efficiency']:6.0%} {serial:>6s} {r['outside_share']:13.0%} {r['bytes_per_rank'] / 1e6:12.2f}")
    return "\n".join(lines)


# --- plots ----------------------------------------------------------------------------------------

def _lines(rows):
    """(label, rows that ran) per mode and series, in order; the mode joins the label when there are two."""
    ran = [r for r in rows if r["step_time_s"] is not None]
    modes = {r["mode"] for r in ran}
    keys = list(dict.fromkeys((r["mode"], r["series"]) for r in ran))
    return [(series if len(modes) == 1 else f"{series} ({mode})",
             [r for r in ran if (r["mode"], r["series"]) == (mode, series)]) for mode, series in keys]


def _axes(ax, rows, ylabel):
    """Rank axis (log 2, a tick per rank count), grid, labels, and the oversubscribed range shaded."""
    ranks = sorted({r["ranks"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.minorticks_off()
    ax.set_xlim(ranks[0] / 1.4, ranks[-1] * 1.4)
    single = [r["host_cpus"] for r in rows if r["host_cpus"] and r["nodes"] == 1]
    if single and ranks[-1] > min(single):
        cpus = min(single)
        ax.axvspan(cpus * 2 ** 0.5, ranks[-1] * 1.4, color="0.5", alpha=0.15, lw=0,
                   label=f"more ranks than the host's {cpus} cores")
    ax.set_xlabel("ranks")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def _caption(rows):
    r = next((r for r in rows if r["step_time_s"] is not None), rows[0])
    modes = sorted({r["mode"] for r in rows})
    return f"{' and '.join(modes)} scaling, {r['model']} model, {r['steps']} steps per point"


def _save(fig, rows, path):
    fig.suptitle(_caption(rows), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _line_plot(rows, path, key, ylabel, ideal, ideal_label, scale=1.0):
    """One line per series of ``key`` x ``scale`` against ranks, and its ideal ``ideal(base_row, row)``
    dashed in the same colour."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    for i, (label, ran) in enumerate(_lines(rows)):
        xs = [r["ranks"] for r in ran]
        (line,) = ax.plot(xs, [r[key] * scale for r in ran], marker="o", label=label)
        ax.plot(xs, [ideal(ran[0], r) * scale for r in ran], ls="--", color=line.get_color(), alpha=0.7,
                label=None if i else f"dashed: {ideal_label}")
    _axes(ax, rows, ylabel)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    _save(fig, rows, path)


def _communication_plot(rows, path):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 4.4))
    share, volume = fig.subplots(1, 2)
    for label, ran in _lines(rows):
        xs = [r["ranks"] for r in ran]
        share.plot(xs, [100 * r["outside_share"] for r in ran], marker="o", label=label)
        volume.plot(xs, [r["bytes_per_rank"] / 1e6 for r in ran], marker="o", label=label)
    _axes(share, rows, "% of the step outside forward/backward")
    share.set_ylim(0, 100)
    share.set_title("time: pipeline waits, DP all-reduce, optimizer, overhead", fontsize=9)
    _axes(volume, rows, "MB of payload per rank per step")
    volume.set_ylim(bottom=0)
    volume.set_title("volume: bytes handed to MPI, all groups, / ranks", fontsize=9)
    share.legend(fontsize=8)
    _save(fig, rows, path)


def _growth(base, row):
    """The ideal speedup: N / N0."""
    return row["ranks"] / base["ranks"]


def _ideal_time(base, row):
    """Strong scaling: the time falls as N0 / N; weak: it stays."""
    return base["step_time_s"] / (_growth(base, row) if row["mode"] == "strong" else 1.0)


def _ideal_tokens(base, row):
    return base["tokens_per_s"] * _growth(base, row)


def _perfect(base, row):
    return 1.0


def plot(rows, directory):
    """The five PNGs into ``directory``; returns their paths."""
    paths = [Path(directory) / name for name in PLOTS]
    time_path, speedup_path, efficiency_path, tokens_path, comm_path = paths
    _line_plot(rows, time_path, "step_time_s", "time per step (ms, median)", _ideal_time,
               "ideal (strong: T0 x N0/N, weak: T0)", scale=1e3)
    _line_plot(rows, speedup_path, "speedup", "speedup over the smallest rank count N0", _growth, "ideal N/N0")
    _line_plot(rows, efficiency_path, "efficiency", "parallel efficiency (%)", _perfect, "ideal 100%", scale=100)
    _line_plot(rows, tokens_path, "tokens_per_s", "tokens/s", _ideal_tokens, "ideal (N/N0 x tokens/s at N0)")
    _communication_plot(rows, comm_path)
    return paths


def report(directory):
    """Read DIR/results, write DIR/scaling.csv and the PNGs; returns (rows, written paths)."""
    rows = derive(load(directory))
    csv_path = Path(directory) / "scaling.csv"
    write_csv(rows, csv_path)
    return rows, [csv_path, *plot(rows, directory)]
