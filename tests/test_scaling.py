"""hpcpar scaling: layouts, the figures derived from results, a tiny real sweep, report, refusals.

The real sweeps are as small as they can be (1 and 2 ranks, 3 steps of the tiny model) and assert
nothing about time: on two shared cores any timing is noise.  They check that every point ran as
the job it should be, and that the results, the CSV and the plots are written and can be redrawn.
"""
import csv
import json

import pytest

from hpcpar.runtime import UsageError
from hpcpar.tools.scaling import layouts, sweep
from hpcpar.tools.scaling.report import PLOTS, derive, karp_flatt
from mpitools import hpcpar, run

PNG = b"\x89PNG\r\n\x1a\n"


def scaling(*args, timeout=120):
    return run(hpcpar() + ["scaling", *map(str, args)], timeout=timeout)[0]


# --- layouts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, ranks, expected", [
    ("dp", 4, "tp1pp1dp4"), ("tp", 2, "tp2pp1dp1"), ("pp", 8, "tp1pp8dp1"), ("dp", 1, "tp1pp1dp1"),
    ("tp2dp", 8, "tp2pp1dp4"), ("dp2tp", 8, "tp4pp1dp2"), ("pp2tp2dp", 16, "tp2pp2dp4"),
    ("tp2pp2dp2", 8, "tp2pp2dp2"), ("tp1/tp2/tp2pp2/tp2pp2dp2", 4, "tp2pp2dp1"),
    ("tp2pp2dp2/dp", 8, "tp2pp2dp2"), ("tp2pp2dp2/dp", 4, "tp1pp1dp4"),      # the explicit one first
])
def test_a_series_picks_one_layout_per_rank_count(spec, ranks, expected):
    assert layouts.label(layouts.parse_series(spec).layout(ranks)) == expected


@pytest.mark.parametrize("spec, ranks, message", [
    ("tp2dp", 3, "3 rank(s) do not split into blocks of 2"),
    ("tp1/tp2", 4, "no layout of 4 rank(s) (its layouts have 1, 2)"),
    ("tp2pp2dp2", 4, "no layout of 4 rank(s)"),
])
def test_a_rank_count_a_series_cannot_fill_is_refused(spec, ranks, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layouts.parse_series(spec).layout(ranks)


@pytest.mark.parametrize("spec, message", [
    ("ep", "is not a layout"), ("tp2x", "is not a layout"), ("", "an empty series"), ("dp,dp", "twice"),
    ("tptp", "names tp twice"), ("tpdp", "at most one axis may grow"), ("tp0", "tp must be at least 1"),
    ("tp/dp", "at most one layout of a series may grow"), ("tp2/dp2", "two layouts of the same size"),
])
def test_a_bad_layout_is_refused(spec, message):
    with pytest.raises(UsageError, match=message):
        layouts.parse_layouts(spec)


def test_ranks_are_sorted_whole_numbers():
    assert layouts.parse_ranks("4, 1,2,2") == [1, 2, 4]
    for bad in ("0", "1,,2", "two", "1.5", "-1"):
        with pytest.raises(UsageError, match="whole numbers of at least 1"):
            layouts.parse_ranks(bad)


def test_weak_scaling_grows_the_global_batch_and_strong_keeps_it():
    series = layouts.parse_layouts("dp")
    assert [p.batch_size for p in layouts.points([1, 2, 4], series, "strong", 16)] == [16, 16, 16]
    assert [p.batch_size for p in layouts.points([1, 2, 4], series, "weak", 16)] == [16, 32, 64]


# --- the figures ----------------------------------------------------------------------------------

def record(mode, ranks, step_time, tokens_per_step, f=0.01, b=0.02, microbatches=2, status=0):
    summary = {"step_time_s": step_time, "tokens_per_s": tokens_per_step / step_time,
               "costs_s": {"F": f, "B": b, "W": 0.0}, "bytes_per_step": {"tp": 1000.0 * ranks, "dp": 3000.0 * ranks}}
    return {"mode": mode, "series": "dp", "ranks": ranks, "layout": {"tp": 1, "pp": 1, "dp": ranks},
            "batch_size": 8, "microbatches": microbatches, "chunks": 1, "exit_status": status, "wall_s": 1.0,
            "summary": summary if status == 0 else None}


def test_strong_scaling_figures():
    rows = derive([record("strong", 4, 0.25, 512), record("strong", 1, 0.8, 512),
                   record("strong", 2, 0.5, 512, status=1)])
    assert [r["ranks"] for r in rows] == [1, 2, 4]
    one, failed, four = rows
    assert one["speedup"] == 1 and one["efficiency"] == 1
    assert four["speedup"] == pytest.approx(3.2) and four["efficiency"] == pytest.approx(0.8)
    # Karp-Flatt: (1/3.2 - 1/4) / (1 - 1/4) = 1/12; none at the base point, where every e fits
    assert four["serial_fraction"] == pytest.approx(1 / 12) and one["serial_fraction"] is None
    assert failed["speedup"] is None and failed["exit_status"] == 1
    # 2 micro-batches x (F + B) = 60 ms of computing in a 250 ms step
    assert four["compute_share"] == pytest.approx(0.24) and four["outside_share"] == pytest.approx(0.76)
    assert four["bytes_per_rank"] == pytest.approx(4000.0)


def test_karp_flatt_inverts_amdahl():
    for e in (0.0, 0.05, 0.5):
        for n in (2, 8, 64):
            assert karp_flatt(1 / (e + (1 - e) / n), n) == pytest.approx(e, abs=1e-12)
    assert karp_flatt(1.0, 1) is None


def test_weak_scaling_speedup_is_the_scaled_speedup():
    rows = derive([record("weak", 1, 0.5, 512), record("weak", 4, 0.625, 4 * 512)])
    # four times the tokens in 1.25 x the time: 3.2 x the throughput, 80% efficiency
    assert rows[1]["speedup"] == pytest.approx(3.2) and rows[1]["efficiency"] == pytest.approx(0.8)


def test_a_point_that_ran_more_than_once_shows_its_fastest_run():
    rows = derive([record("strong", 1, 0.8, 512), record("strong", 1, 0.6, 512), record("strong", 1, 0.7, 512, status=1),
                   record("strong", 2, 0.5, 512, status=1)])
    assert [(r["ranks"], r["runs"], r["step_time_s"], r["exit_status"]) for r in rows] == [(1, 3, 0.6, 0), (2, 1, None, 1)]


def test_repeated_runs_rotate_through_the_points():
    points = layouts.points([1, 2, 4], layouts.parse_layouts("dp"), "strong", 8)
    assert [name for _, name in sweep.runs(points, 1)] == ["strong-dp-n1", "strong-dp-n2", "strong-dp-n4"]
    assert [name for _, name in sweep.runs(points, 2)] == [
        "strong-dp-n1-run1", "strong-dp-n2-run1", "strong-dp-n4-run1",
        "strong-dp-n2-run2", "strong-dp-n4-run2", "strong-dp-n1-run2"]


# --- real sweeps ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """A weak-scaling sweep over tp at 1 and 2 ranks (a batch of 4 per rank), 3 steps of the tiny model."""
    out = tmp_path_factory.mktemp("sweep")
    proc = scaling("--ranks", "1,2", "--mode", "weak", "--layouts", "tp", "--batch-size", 4,
                   "--model", "tiny", "--steps", 3, "--no-progress", "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc


def test_a_sweep_stores_one_result_per_run(sweep_dir):
    out, _ = sweep_dir
    tokens = []
    for ranks, tp, batch in ((1, 1, 4), (2, 2, 8)):
        result = json.loads((out / "results" / f"weak-tp-n{ranks}.json").read_text())
        assert result["exit_status"] == 0 and result["batch_size"] == batch
        assert result["command"][result["command"].index("-n") + 1] == str(ranks)
        assert result["command"][result["command"].index("train") + 1:][:4] == ["--tp", str(tp), "--pp", "1"]
        assert "--steps" in result["command"] and "--no-progress" in result["command"]
        assert result["summary"]["layout"]["world"] == ranks and result["summary"]["layout"]["tp"] == tp
        tokens.append(result["summary"]["tokens_per_step"])
        log = (out / result["log"]).read_text()
        assert log.count(f"tp {tp} x pp 1 x dp 1 = {ranks} ranks") == 1
    assert tokens[1] == 2 * tokens[0]                             # weak: twice the work on twice the ranks
    assert not list((out / "logs").glob("*.summary.json"))       # folded into the results


def test_a_sweep_writes_the_csv_and_the_plots(sweep_dir):
    out, proc = sweep_dir
    rows = list(csv.DictReader((out / "scaling.csv").open()))
    assert [(r["ranks"], r["layout"], r["batch_size"], r["runs"]) for r in rows] == [
        ("1", "tp1pp1dp1", "4", "1"), ("2", "tp2pp1dp1", "8", "1")]
    assert float(rows[0]["speedup"]) == 1.0 and float(rows[1]["speedup"]) > 0
    for name in PLOTS:
        assert (out / name).read_bytes().startswith(PNG)
    assert "weak" in proc.stdout and "tp2pp1dp1" in proc.stdout and "wrote " in proc.stdout


def test_report_redraws_from_the_stored_results(sweep_dir):
    out, _ = sweep_dir
    for name in ("scaling.csv", *PLOTS):
        (out / name).unlink()
    proc = scaling("report", out)
    assert proc.returncode == 0, proc.stderr
    assert len(list(csv.DictReader((out / "scaling.csv").open()))) == 2
    for name in PLOTS:
        assert (out / name).read_bytes().startswith(PNG)


def test_failed_and_hung_points_are_recorded_and_the_sweep_goes_on(tmp_path):
    # 1 rank trains far longer than --timeout; at 2 ranks rank 1 raises at its first step (an injected fault:
    # a layout the options cannot hold is refused before the sweep starts, below)
    proc = run(hpcpar() + ["scaling", "--ranks", "1,2", "--layouts", "tp", "--hidden", "48", "--heads", "4",
                           "--steps", "100000", "--timeout", "10", "--no-progress", "--out", str(tmp_path)],
               timeout=120, env={"HPCPAR_FAULT": "step:1@1"})[0]
    assert proc.returncode == 1
    assert "2 of 2 run(s) failed: tp on 1, tp on 2" in proc.stderr
    hung = json.loads((tmp_path / "results" / "strong-tp-n1.json").read_text())
    assert hung["timed_out"] and hung["exit_status"] is None and hung["summary"] is None
    failed = json.loads((tmp_path / "results" / "strong-tp-n2.json").read_text())
    assert failed["exit_status"] == 1 and "injected fault at step 1" in failed["error"]
    assert (tmp_path / "scaling.csv").exists()


@pytest.mark.parametrize("args, message", [
    (["--ranks", "1,2", "--layouts", "ep"], "--layouts: 'ep' is not a layout"),
    (["--ranks", "1,3", "--layouts", "tp2dp"], "--layouts tp2dp: 1 rank(s) do not split into blocks of 2"),
    (["--ranks", "2,x"], "--ranks '2,x': give whole numbers"),
    (["--layouts", "dp"], "hpcpar scaling needs --ranks"),
    (["--ranks", "2", "--tp", "2"], "--tp is set point by point from --layouts"),
    (["--ranks", "2", "--metrics", "m.jsonl"], "--metrics: every point would write the same file"),
    (["--ranks", "8", "--batch-size", "4"], "--layouts dp at 8 ranks (tp1pp1dp8): --batch-size 4 must divide"),
    (["--ranks", "1,2", "--layouts", "tp", "--hidden", "48", "--heads", "3"],
     "--layouts tp at 2 ranks (tp2pp1dp1): --tp 2 must divide the number of attention heads (3)"),
    (["--ranks", "2", "--mode", "medium"], "argument --mode: invalid choice: 'medium'"),
    (["--ranks", "2", "--launcher", "mpirun"], "argument --launcher: invalid choice: 'mpirun'"),
    (["--ranks", "2", "--repeat", "0"], "--repeat must be at least 1, got 0"),
    (["--ranks", "2", "--timeout", "0"], "--timeout must be positive, got 0.0"),
    (["report"], "hpcpar scaling report needs the sweep's directory"),
    (["report", "/nonexistent"], "no results in /nonexistent/results"),
])
def test_bad_input_is_refused_with_one_line(args, message):
    proc = scaling(*args, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert proc.stdout == ""
