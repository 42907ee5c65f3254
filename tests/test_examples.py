"""Every program in hpcpar/examples runs, and its chapter quotes it.

Each example runs once per test session, with the command its chapter quotes (docs_session: the
commands of the docs, run in a scratch directory, with a timeout so that a hang fails the test);
tests/test_docs.py checks the quoted output against it.
"""
import functools
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import hpcpar.examples
from docs_session import docs_session
from hpcpar.tools.quotes.blocks import blocks
from mpitools import run, run_mpi

EXAMPLES = sorted(m.name for m in pkgutil.iter_modules(hpcpar.examples.__path__) if not m.name.startswith("_"))
RANKS = {"one_step": 1, "caches": 1, "tp_split": 2, "tp_gpt": 2, "pipeline_by_hand": 2,
         "data_parallel_by_hand": 2, "collectives": 4, "ring_by_hand": 2, "zero_timeline": 2, "muon_tp": 2}
MPI_EXAMPLES = sorted(name for name, n in RANKS.items() if n > 1)


# the chapter that quotes each example's whole output
QUOTED_IN = {"one_step": "engine.md", "caches": "engine.md", "tp_split": "tensor_parallel.md",
             "tp_gpt": "tensor_parallel.md", "pipeline_by_hand": "pipeline.md",
             "data_parallel_by_hand": "data_parallel.md", "collectives": "collectives.md",
             "ring_by_hand": "context_parallel.md", "zero_timeline": "zero.md", "muon_tp": "optimizers.md"}
DOCS = Path(__file__).resolve().parent.parent / "docs"


def command(name):
    """The command line the docs quote for an example."""
    module = f".venv/bin/python -m hpcpar.examples.{name}"
    return module if RANKS[name] == 1 else f".venv/bin/mpiexec -n {RANKS[name]} {module}"


@functools.lru_cache(maxsize=None)
def example(name):
    """The example's output (it must exit 0), from the run the docs check uses too."""
    status, lines = docs_session().output(command(name))
    assert status == 0, "\n".join(lines)
    return "\n".join(lines) + "\n"


# The single-rank float64 loss of the examples' batch.  Other layouts and BLAS kernels reach it by other
# routes (other summation orders), so printed losses are compared to 1e-12 relative, never as text.
LOSS = 3.488397655419


def numbers_after(label, out):
    """Every number printed right after ``label`` in ``out``."""
    return [float(x) for x in re.findall(re.escape(label) + r" *(-?[0-9.]+(?:e[-+]?[0-9]+)?)", out)]


def near(numbers, value, count=1, rel=1e-12):
    return len(numbers) == count and all(abs(x - value) <= rel * abs(value) for x in numbers)


def rank_lines(out, rank):
    return [line for line in out.splitlines() if line.startswith(f"rank {rank}: ")]


def test_every_example_is_tested_and_documented():
    assert set(EXAMPLES) == set(RANKS)
    for name in EXAMPLES:
        doc = __import__(f"hpcpar.examples.{name}", fromlist=["_"]).__doc__
        assert doc and f"hpcpar.examples.{name}" in doc, f"{name}: the docstring must say how to run it"


@pytest.mark.parametrize("name", sorted(QUOTED_IN))
def test_docs_quote_the_current_output(name):
    """The chapter quotes the example in a console block, which tests/test_docs.py checks against its
    output (to the tolerance of hpcpar/tools/quotes/compare.py: round-off and timings are not text)."""
    quoted = [q.command for b in blocks(DOCS / QUOTED_IN[name]) for q in b.quotes]
    assert command(name) in quoted, f"docs/{QUOTED_IN[name]} has no console block '$ {command(name)}'"
    example(name)


def test_tp_split_prints_the_worked_example_rank_by_rank():
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


def test_ring_by_hand_balances_the_work_and_equals_one_rank():
    out = example("ring_by_hand")
    r0, r1 = rank_lines(out, 0), rank_lines(out, 1)
    assert "rank 0: holds positions (0, 1, 6, 7)" in r0 and "rank 1: holds positions (2, 3, 4, 5)" in r1
    # the other rank's block is half a square on both ranks: early keys for all, or all keys for late queries
    assert "rank 0: step 1: keys of rank 1 (2, 3, 4, 5): 2 queries x 4 keys" in r0
    assert "rank 1: step 1: keys of rank 0 (0, 1, 6, 7): 4 queries x 2 keys" in r1
    assert sum("scores computed: 24, of which causal (key <= query): 18" in line for line in r0 + r1) == 2
    assert sum("sent 1024 B" in line for line in r0 + r1) == 2
    assert sum("equal one rank's attention: True" in line for line in r0 + r1) == 2


def test_tp_gpt_counts_and_memory():
    out = example("tp_gpt")
    assert near(numbers_after("loss", out), LOSS, count=3)  # one rank, tp 2, tp 2 + sequence parallelism
    # 2 all-reduces per block each way, plus the embedding's g and the loss (forward), the head's f (backward)
    assert "  forward:  7 all_reduce (5.05 MiB)" in out and "  backward: 5 all_reduce (5.00 MiB)" in out
    assert "  forward:  5 all_gather (2.50 MiB), 2 all_reduce (0.05 MiB), 5 reduce_scatter (5.00 MiB)" in out
    assert "  backward: 9 all_gather (4.50 MiB), 5 reduce_scatter (5.00 MiB)" in out
    kept = [float(x) for x in re.findall(r"blocks ([0-9.]+) MiB", out)]
    assert kept == [42.06, 25.06, 21.03]


def test_one_step_matches_the_trainer():
    out = example("one_step")
    assert "entropy floor 0.911941" in out                     # exact: a closed formula, 6 digits
    assert re.search(r"block h\.0 +\(32, 64, 64\) -> \(32, 64, 64\)", out)
    assert re.search(r"c_attn .* \(32, 64, 64\) -> \(32, 64, 192\)", out)
    assert re.search(r"softmax\(Q K\^T/sqrt\(HS\) \+ M\) V +\(32, 4, 64, 16\)", out)
    assert re.search(r"logits = h wte\^T +\(2048, 64\) -> \(2048, 32\)", out)
    assert near(numbers_after("loss = sum / tokens =", out), 7144.238398, rel=1e-9)
    assert near(numbers_after("/ 2048 =", out), LOSS)
    assert near(numbers_after("global gradient norm", out), 0.613737, rel=1e-5)  # 6 digits printed
    assert near(numbers_after("step 1 loss", out), 3.457877734373)
    assert "same numbers as the hand-written step: yes" in out


def test_caches_micro_batches_recompute_and_split():
    out = example("caches")
    assert near(numbers_after("whole batch: loss", out), LOSS)
    assert "gradients bit for bit equal: True" in out
    assert "weight gradients still zero: True" in out
    for diff in re.findall(r"max relative difference ([0-9.e+-]+)", out):
        assert float(diff) < 1e-13


def test_pipeline_by_hand_equals_one_rank():
    out = example("pipeline_by_hand")
    assert near(numbers_after("pipeline loss", out), LOSS) and near(numbers_after("one rank: loss", out), LOSS)
    assert any("send activation (16, 64, 64) (512 KiB) to rank 1" in line for line in rank_lines(out, 0))
    assert any("send gradient (16, 64, 64) to rank 0" in line for line in rank_lines(out, 1))
    for r in (0, 1):
        assert near(numbers_after("after summing both copies", "\n".join(rank_lines(out, r))), 0.346572, rel=1e-5)
        diffs = re.findall(r"max relative difference ([0-9.e+-]+)", "\n".join(rank_lines(out, r)))
        assert diffs and all(float(d) < 1e-13 for d in diffs)


def test_data_parallel_by_hand_equals_one_rank():
    out = example("data_parallel_by_hand")
    assert near(numbers_after("\nloss", "\n" + out), LOSS) and near(numbers_after("(one rank:", out), LOSS)
    for r in (0, 1):
        lines = rank_lines(out, r)
        assert any(f"samples {16 * r}-{16 * r + 15}" in line for line in lines)
        # the first bucket's all-reduce starts before the backward has finished
        started = [i for i, line in enumerate(lines) if "bucket 0 all-reduce started" in line]
        finished = [i for i, line in enumerate(lines) if "backward finished; waiting" in line]
        assert started and finished and started[0] < finished[0]
        diffs = re.findall(r"(?:after the all-reduces: |max relative difference )([0-9.e+-]+)", "\n".join(lines))
        assert len(diffs) == 2 and all(float(d) < 1e-13 for d in diffs)


@pytest.mark.parametrize("name", MPI_EXAMPLES)
def test_mpi_examples_refuse_one_rank(name):
    proc, _ = run([sys.executable, "-m", f"hpcpar.examples.{name}"], timeout=60)
    assert proc.returncode == 2 and f"mpiexec -n {RANKS[name]}" in proc.stderr


def test_collectives_demonstrates_every_pattern_and_its_cost():
    out = example("collectives")
    assert "every rank holds what numpy computes: yes" in out
    assert "rank 3: (30, 31, 32, 33) -> (72)" in out                       # reduce-scatter: element 3 of the sum
    assert out.count("-> (60, 64, 68, 72)") == 5                           # reduce on rank 0, all-reduce on all 4
    assert re.search(r"^all-reduce +[0-9.]+ ms +[0-9.]+ ms$", out, re.M)


def test_muon_tp_shows_the_exact_modes_equal_one_rank_and_blockwise_not():
    """The worked example of docs/optimizers.md: duplicated and distributed give each rank its shard of the
    whole matrix's Newton-Schulz, blockwise does not - and its halves together are no orthogonal matrix."""
    out = example("muon_tp")
    diffs = {mode: numbers_after(f"{mode:<12} max |O_r - NS(U)[:, 4r:4r+4]| =", out)
             for mode in ("duplicated", "distributed", "blockwise")}
    assert len(diffs["duplicated"]) == 2 and max(diffs["duplicated"] + diffs["distributed"]) < 1e-12
    assert min(diffs["blockwise"]) > 0.1
    svs = re.findall(r"^blockwise: \[O_0 \| O_1\] has singular values \(([^)]*)\)", out, re.M)
    assert svs and min(float(x) for x in svs[0].split(",")) > 1.1
