"""The benchmark suite: a quick run writes valid JSON and Markdown; the GEMM list matches the FLOP model.

No assertion here is about speed: timings on a shared machine are the benchmark's business, not a
test's (BENCHMARKS.md, docs/performance.md).
"""
import json

import pytest

from hpcpar.tools.bench.gemm import block_gemms, head_gemms
from hpcpar.flops import gpt_step_flops
from hpcpar.nn.gpt import GPTConfig
from mpitools import hpcpar, run


def test_quick_bench_writes_json_and_a_markdown_table(tmp_path):
    out, md = tmp_path / "results.json", tmp_path / "BENCHMARKS.md"
    proc, _ = run(hpcpar() + ["bench", "--quick", "--only", "gemm", "--out", str(out), "--markdown", str(md)],
                  timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["quick"] and dict(report["machine"])["numpy"]
    assert "GFLOP/s" in dict(report["machine"])["GEMM rate, one thread (numpy, 1024 x 1024 x 1024)"]
    (gemm,) = report["benchmarks"]["gemm"]["runs"]
    assert "error" not in gemm and gemm["tables"][0]["rows"]
    assert set(gemm["figures"]["peak_gflops"]) == {"float32", "float64"}
    text = md.read_text()
    assert "## (a) GEMM rate" in text and "| GEMM | m x k x n |" in text and "OPENBLAS_CORETYPE" in text


def test_peer_summary_quotes_the_median_of_the_rounds_with_its_range():
    from hpcpar.tools.bench.common import spread, summary
    fig = summary({"ours": [1.0, 2.0, 3.0, 4.0, 10.0], "theirs": [2.0, 2.0, 2.0, 2.0, 2.0]}, "ours", "theirs")
    assert fig["ratio_median_paired"] == 1.5 and (fig["ratio_min"], fig["ratio_max"]) == (0.5, 5.0)
    assert spread(fig) == "1.50x (0.50-5.00, 5 rounds)"


def test_step_split_takes_the_peers_gemms_from_its_profiler_and_the_bound_from_our_floor():
    """(s)'s last table: PyTorch's GEMM seconds are its GEMM ops' self time, the rest each side's step minus
    its GEMMs in the step, and the bound our GEMM floor over the peer's step."""
    torch = pytest.importorskip("torch")
    from hpcpar.tools.bench.common import Result
    from hpcpar.tools.bench.step import bench_split, peer_gemm_seconds
    a = torch.randn(128, 128)
    assert peer_gemm_seconds(torch, lambda: a @ a, 2) > 0 and peer_gemm_seconds(torch, lambda: a + a, 2) == 0
    res = Result()
    res.figures = {"step, 1 thread, PyTorch eager": {"ours_median_s": 2.0, "theirs_median_s": 2.5},
                   "profile": {"gemm_floor": 1.5}, "gemm_in_step": 1.6}
    bench_split(res, torch, {"torch": lambda: a @ a}, quick=True)
    split = res.figures["split"]
    assert (split["ours_gemm_s"], split["ours_rest_s"], split["bound"]) == (1.6, 2.0 - 1.6, 1.5 / 2.5)
    assert 0 < split["peer_gemm_s"] < 0.1 and split["peer_gemm_s"] + split["peer_rest_s"] == pytest.approx(2.5)
    (table,) = res.tables
    assert table["rows"][-1][0].endswith("the lowest ratio reachable") and table["rows"][-1][-1] == "0.60x"


def test_fast_ops_bench_has_a_ratio_per_op():
    from hpcpar.tools.bench import fast_ops
    res = fast_ops.run(quick=True)
    (table,) = res.tables
    assert [row[0] for row in table["rows"]] == list(res.figures) and all("rounds)" in row[-1] for row in table["rows"])


def test_moe_bench_quotes_the_median_of_its_rounds_per_step():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hpcpar.tools.bench import moe
    res = moe.run(quick=True)
    fig = res.figures["moe_block"]
    (target,) = res.targets
    assert fig["rounds"] == 3 and fig["ours_median_s"] > 0 and fig["theirs_median_s"] > 0
    assert target["value"] == res.tables[0]["rows"][0][-1] and "3 rounds)" in target["value"]


def test_quick_overlap_and_async_progress_benchmarks(tmp_path):
    """Both DP overlap benchmarks run at 2 ranks; the async one under its MPI setting, which the
    driver sets for that benchmark only and shows in the command it reports."""
    out = tmp_path / "results.json"
    proc, _ = run(hpcpar() + ["bench", "--quick", "--only", "overlap,overlap-async", "--out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    (plain,), (progress,) = (report["benchmarks"][n]["runs"] for n in ("overlap", "overlap-async"))
    assert "error" not in plain and "error" not in progress
    assert {"polled between GEMMs", "polled at reports only", "not polled"} <= set(plain["figures"])
    assert progress["command"].startswith("MPIR_CVAR_ASYNC_PROGRESS=1 mpiexec -n 2")
    assert "MPIR_CVAR_ASYNC_PROGRESS=1" in progress["tables"][0]["title"]


def test_unknown_benchmark_is_refused():
    proc, _ = run(hpcpar() + ["bench", "--only", "gemm,nonsense"], timeout=60)
    assert proc.returncode == 2 and "nonsense" in proc.stderr


@pytest.mark.parametrize("hidden,heads,seq,vocab", [(64, 2, 32, 0), (256, 4, 128, 1024)])
def test_gemm_list_has_the_flops_of_the_model_formula(hidden, heads, seq, vocab):
    """The GEMMs the benchmarks time are exactly the model FLOPs hpcpar.flops counts (one block + head)."""
    batch = 3
    cfg = GPTConfig(d_model=hidden, d_ff=4 * hidden, n_layer=1, vocab_size=vocab, seq_len=seq, n_head=heads)
    gemms = block_gemms(hidden, batch, seq, heads) + (head_gemms(hidden, vocab, batch * seq) if vocab else [])
    assert sum(g.flops for g in gemms) == gpt_step_flops(cfg, batch * seq)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_recomputation_bench_measures_less_kept_memory_the_more_is_recomputed(arch):
    """The recompute benchmark's memory figures (not its timings): full < selective < none, both kept
    after the forward and at the peak of the step."""
    import numpy as np
    from hpcpar.tools.bench.recompute import MODES, QUICK_MODEL, memory, stage
    model = stage(arch, QUICK_MODEL)
    tokens = np.random.default_rng(0).integers(0, 1024, size=(2, QUICK_MODEL["seq_len"] + 1))
    kept, peak = zip(*(memory(model, tokens[:, :-1], tokens[:, 1:], mode) for mode in MODES))   # none, sel., full
    assert kept[2] < kept[1] < kept[0] and peak[2] < peak[1] < peak[0]


@pytest.mark.slow
def test_quick_bf16_benchmarks_name_the_provider_and_hold_their_targets_as_figures():
    from hpcpar.tools.bench import bf16_cores, bf16_step
    res = bf16_step.run(quick=True)
    assert any("GEMM rates" in t["title"] for t in res.tables) and "bf16 profile" in res.figures
    assert {t["what"].split(":")[0] for t in res.targets} >= {"bf16 step / its own bf16 GEMM floor"}
    res = bf16_cores.run(quick=True)
    assert set(res.figures["text"]["val_loss"]) == {"fp32", "bf16"}
