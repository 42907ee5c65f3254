"""Every program in hpcpar/examples runs, and prints the lines the docs quote.

Serial examples run with this interpreter; MPI examples as whole jobs (mpiexec -n 2) from a serial
test, with a timeout so that a hang fails the test.
"""
import functools
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import hpcpar.examples
from mpitools import run, run_mpi

EXAMPLES = sorted(m.name for m in pkgutil.iter_modules(hpcpar.examples.__path__) if not m.name.startswith("_"))
SERIAL = {"one_step", "caches"}
MPI_2 = {"tp_split", "tp_gpt", "pipeline_by_hand", "data_parallel_by_hand"}


# the chapter that quotes each example's whole output
QUOTED_IN = {"one_step": "engine.md", "caches": "engine.md", "tp_split": "tensor_parallel.md",
             "tp_gpt": "tensor_parallel.md", "pipeline_by_hand": "pipeline.md",
             "data_parallel_by_hand": "data_parallel.md"}
DOCS = Path(__file__).resolve().parent.parent / "docs"


@functools.lru_cache(maxsize=None)
def example(name):
    """Run an example the way its docstring says; returns its stdout (it must exit 0)."""
    cmd = [sys.executable, "-m", f"hpcpar.examples.{name}"]
    proc, _ = run(cmd, timeout=120) if name in SERIAL else run_mpi(2, cmd, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def rank_lines(out, rank):
    return [line for line in out.splitlines() if line.startswith(f"rank {rank}: ")]


def test_every_example_is_tested_and_documented():
    assert set(EXAMPLES) == SERIAL | MPI_2
    for name in EXAMPLES:
        doc = __import__(f"hpcpar.examples.{name}", fromlist=["_"]).__doc__
        assert doc and f"hpcpar.examples.{name}" in doc, f"{name}: the docstring must say how to run it"


@pytest.mark.parametrize("name", sorted(QUOTED_IN))
def test_docs_quote_the_current_output(name):
    """Every line the example prints appears in its chapter: the docs are not stale."""
    text = (DOCS / QUOTED_IN[name]).read_text()
    missing = [line for line in example(name).splitlines() if line.strip() and line not in text]
    assert not missing, f"docs/{QUOTED_IN[name]} does not show these lines of {name}: {missing}"


def test_tp_split_prints_the_seed_example_rank_by_rank():
    out = example("tp_split")
    r0, r1 = rank_lines(out, 0), rank_lines(out, 1)
    assert "x W on one rank: (6, 8, 10, 12)" in out
    assert any("computes x W_0 = (6, 8)   (communication: none)" in line for line in r0)
    assert any("computes x W_1 = (10, 12)   (communication: none)" in line for line in r1)
    assert sum("gathered (6, 8, 10, 12)" in line for line in r0 + r1) == 2
    # backward of the column split: the parts (3, 11) and (7, 15) sum to dL/dx = (10, 26)
    assert any("(3, 11)" in line for line in r0) and any("(7, 15)" in line for line in r1)
    assert sum("dL/dx = (10, 26)" in line for line in r0 + r1) == 2
    # row split: partial sums, then the all-reduce
    assert any("partial sum x_0 W[0, :] = (1, 2, 3, 4)" in line for line in r0)
    assert any("partial sum x_1 W[1, :] = (5, 6, 7, 8)" in line for line in r1)
    assert sum("after the all-reduce (6, 8, 10, 12)" in line for line in r0 + r1) == 2
    assert "gathered == x W: True" in out and "all-reduced == x W: True" in out


def test_tp_split_refuses_a_wrong_world_size():
    proc, _ = run_mpi(3, [sys.executable, "-m", "hpcpar.examples.tp_split"], timeout=60)
    assert proc.returncode == 2
    assert "mpiexec -n 2" in proc.stderr


def test_tp_gpt_counts_and_memory():
    out = example("tp_gpt")
    assert out.count("loss 3.488397655419") == 3          # one rank, tp 2, tp 2 + sequence parallelism
    # 2 all-reduces per block each way, plus the embedding's g and the loss (forward), the head's f (backward)
    assert "  forward:  7 all_reduce (5.05 MiB)" in out and "  backward: 5 all_reduce (5.00 MiB)" in out
    assert "  forward:  5 all_gather (2.50 MiB), 2 all_reduce (0.05 MiB), 5 reduce_scatter (5.00 MiB)" in out
    assert "  backward: 9 all_gather (4.50 MiB), 5 reduce_scatter (5.00 MiB)" in out
    kept = [float(x) for x in re.findall(r"blocks ([0-9.]+) MiB", out)]
    assert kept == [50.06, 29.06, 25.03]


def test_one_step_matches_the_trainer():
    out = example("one_step")
    assert "entropy floor 0.911941" in out
    assert re.search(r"block h\.0 +\(32, 64, 64\) -> \(32, 64, 64\)", out)
    assert re.search(r"c_attn .* \(32, 64, 64\) -> \(32, 64, 192\)", out)
    assert re.search(r"softmax\(Q K\^T/sqrt\(HS\) \+ M\) V +\(32, 4, 64, 16\)", out)
    assert re.search(r"logits = h wte\^T +\(2048, 64\) -> \(2048, 32\)", out)
    assert "loss = sum / tokens = 7144.238398 / 2048 = 3.488397655419" in out
    assert "global gradient norm 0.613737" in out
    assert "step 1 loss 3.457877734373" in out
    assert "same numbers as the hand-written step: yes" in out


def test_caches_micro_batches_recompute_and_split():
    out = example("caches")
    assert "whole batch: loss 3.488397655419" in out
    assert "gradients bit for bit equal: True" in out
    assert "weight gradients still zero: True" in out
    for diff in re.findall(r"max relative difference ([0-9.e+-]+)", out):
        assert float(diff) < 1e-13


def test_pipeline_by_hand_equals_one_rank():
    out = example("pipeline_by_hand")
    assert "pipeline loss 3.488397655419" in out and "one rank: loss 3.488397655419" in out
    assert any("send activation (16, 64, 64) (512 KiB) to rank 1" in line for line in rank_lines(out, 0))
    assert any("send gradient (16, 64, 64) to rank 0" in line for line in rank_lines(out, 1))
    for r in (0, 1):
        assert any("after summing both copies 0.346572" in line for line in rank_lines(out, r))
        diffs = re.findall(r"max relative difference ([0-9.e+-]+)", "\n".join(rank_lines(out, r)))
        assert diffs and all(float(d) < 1e-13 for d in diffs)


def test_data_parallel_by_hand_equals_one_rank():
    out = example("data_parallel_by_hand")
    assert "loss 3.488397655419 (one rank: 3.488397655419)" in out
    for r in (0, 1):
        lines = rank_lines(out, r)
        assert any(f"samples {16 * r}-{16 * r + 15}" in line for line in lines)
        # the first bucket's all-reduce starts before the backward has finished
        started = [i for i, line in enumerate(lines) if "bucket 0 all-reduce started" in line]
        finished = [i for i, line in enumerate(lines) if "backward finished; waiting" in line]
        assert started and finished and started[0] < finished[0]
        diffs = re.findall(r"(?:after the all-reduces: |max relative difference )([0-9.e+-]+)", "\n".join(lines))
        assert len(diffs) == 2 and all(float(d) < 1e-13 for d in diffs)


@pytest.mark.parametrize("name", sorted(MPI_2))
def test_mpi_examples_refuse_one_rank(name):
    proc, _ = run([sys.executable, "-m", f"hpcpar.examples.{name}"], timeout=60)
    assert proc.returncode == 2 and "mpiexec -n 2" in proc.stderr
