"""Tracing a real 2 x 2 run: one Chrome trace for all ranks, matched flow arrows, summary and plot."""
import json
from collections import Counter

from mpitools import hpcpar, run, run_mpi


def test_trace_of_a_pipeline_run(tmp_path):
    out = tmp_path / "t.json"
    proc, _ = run_mpi(4, hpcpar() + ["train", "--tp", "2", "--pp", "2", "--microbatches", "4", "--steps", "4",
                                     "--layers", "4", "--no-progress", "--trace", str(out), "--trace-steps", "2"],
                      timeout=120)
    assert proc.returncode == 0, proc.stderr
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == sorted(f"rank {r} tp{r % 2}.pp{r // 2}.dp0" for r in range(4))
    work = Counter((e["pid"], e["cat"]) for e in events if e["ph"] == "X" and e["cat"] in ("F", "B"))
    assert set(work.values()) == {2 * 4}                    # 2 traced steps x 4 micro-batches, per rank
    flows = Counter((e["id"], e["ph"]) for e in events if e["ph"] in ("s", "f"))
    ids = {i for i, _ in flows}
    assert len(ids) == 2 * 4 * 2 * 2                        # steps x mbs x (F and B) x TP pipelines
    assert all(flows[(i, "s")] == 1 and flows[(i, "f")] == 1 for i in ids)
    assert any(e["ph"] == "X" and e["cat"] == "collective" and e["name"] == "tp all_reduce" for e in events)

    summary, _ = run(hpcpar() + ["trace", "summary", str(out)])
    assert summary.returncode == 0, summary.stderr
    assert "bubble    measured" in summary.stdout and "simulated" in summary.stdout
    assert summary.stdout.count("rank ") == 4 + 1
    png = tmp_path / "timeline.png"
    plot, _ = run(hpcpar() + ["trace", "plot", str(out), "-o", str(png)])
    assert plot.returncode == 0 and png.read_bytes()[:4] == b"\x89PNG"
    # annotated, and by default beside the trace (never into the working directory or the repository)
    plot, _ = run(hpcpar() + ["trace", "plot", str(out), "--annotate"], cwd=tmp_path)
    assert plot.returncode == 0 and plot.stdout.strip() == f"wrote {tmp_path / 't.png'}"
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    from hpcpar.tools.trace import report as trace_report
    meta, names, spans = trace_report.load(out)
    pids = sorted(spans)
    zero = min(e["ts"] for evs in spans.values() for e in evs if e["cat"] == "F")
    lanes, arrows, notes = trace_report._annotations(spans, names, pids, zero, 1e9, trace_report.flows(out))
    assert any(lanes) and arrows and [n[2] for n in notes][0] == "TP all-reduce"
    assert trace_report._largest_gap([[(0.0, 1.0, "F", 0, 0)], [(2.5, 3.0, "F", 0, 0)]], 3.0) == (1.25, 1)
    bad, _ = run(hpcpar() + ["trace", "summary", str(tmp_path / "missing.json")])
    assert bad.returncode == 2 and "cannot read trace" in bad.stderr


def test_summary_simulates_the_runs_recorded_schedule():
    """A --schedule-file run has no schedule name to rebuild by: the trace carries the order itself."""
    from hpcpar.pipeline.bubble import simulated_bubble
    from hpcpar.pipeline.csv_format import dumps
    from hpcpar.pipeline.schedules import build
    from hpcpar.tools.trace.report import simulated
    zbv = build("zb-v", 2, 4, 2)
    meta = {"schedule": "schedule file zbv.csv", "stages": 2, "microbatches": 4, "chunks": 2,
            "schedule_csv": dumps(zbv)}
    figures = {0: {"costs": {"F": [1.0], "B": [2.0], "W": [1.0]}}}
    assert simulated(meta, figures) == simulated_bubble(zbv, {"F": 1.0, "B": 2.0, "W": 1.0}) > 0


def test_zero3_trace_holds_each_units_gathers_compute_frees_and_reduce_scatters(tmp_path):
    """dp 2, 2 untied blocks (4 units): per rank and traced step, 7 all-gathers (the head's kept from its
    forward into its backward), a forward and a backward of each unit, 7 frees, 4 reduce-scatters; each
    unit's forward after the end of its all-gather; and the --zero plot of it."""
    out = tmp_path / "z.json"
    proc, _ = run_mpi(2, hpcpar() + ["train", "--dp", "2", "--zero", "3", "--untied", "--layers", "2", "--steps", "2",
                                     "--no-progress", "--trace", str(out)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    events = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X" and e["cat"] == "fsdp"]
    for pid in (0, 1):
        mine = sorted((e for e in events if e["pid"] == pid), key=lambda e: e["ts"])
        kinds = Counter(e["name"].rsplit(" ", 1)[0] for e in mine)
        assert kinds == {"all-gather": 7, "F": 4, "B": 4, "free": 7, "reduce-scatter": 4}, kinds
        gathered = {}                               # unit -> the end of its first all-gather's wait
        for e in mine:
            if e["name"].startswith("all-gather"):
                gathered.setdefault(e["name"].split()[-1], e["ts"] + e["dur"])
        assert all(e["ts"] >= gathered[e["name"].split()[-1]] - 0.01 for e in mine if e["name"].startswith("F "))
    png = tmp_path / "z.png"
    plot, _ = run(hpcpar() + ["trace", "plot", str(out), "--zero", "-o", str(png)])
    assert plot.returncode == 0 and png.read_bytes()[:4] == b"\x89PNG", plot.stderr
