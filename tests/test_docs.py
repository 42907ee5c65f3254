"""The docs' cheap commands and code blocks still do what the docs say they do.

* every ```python block of docs/*.md that holds a doctest (>>> lines) runs and gives the printed output;
* the training commands quoted in the docs print the losses quoted there (float64: to 12 digits), and
  every layout prints the same losses as one rank;
* the quickstart's plotting snippet runs on a real metrics file.

The examples quoted in the docs are run by tests/test_examples.py.
"""
import doctest
import json
import re
import sys
from pathlib import Path

import pytest

from mpitools import hpcpar, run, run_mpi

DOCS = Path(__file__).resolve().parent.parent / "docs"


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


DOCTESTS = [(md.name, i, block) for md in sorted(DOCS.glob("*.md"))
            for i, block in enumerate(python_blocks(md)) if ">>>" in block]


@pytest.mark.parametrize("name, index, block", DOCTESTS, ids=[f"{n}[{i}]" for n, i, _ in DOCTESTS])
def test_doc_doctests(name, index, block):
    test = doctest.DocTestParser().get_doctest(block, {}, f"{name}[{index}]", name, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0, f"{name}: a doctest in python block {index} failed"


def losses(out):
    """The loss column of `hpcpar train`'s step lines."""
    return re.findall(r"^step +\d+/\d+  loss (\S+)", out, re.M)


def train(n, *flags, timeout=120):
    args = hpcpar() + ["train", "--no-progress", "--log-every", "1", "--dtype", "float64", *flags]
    proc, _ = run(args, timeout=timeout) if n == 1 else run_mpi(n, args, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def quoted_losses(doc, command):
    """The losses printed under ``command`` in a doc's code block."""
    text = (DOCS / doc).read_text()
    start = text.index(command)
    block = text[start:text.index("```", start)]
    return losses(block)


def test_engine_one_rank_two_steps():
    out = train(1, "--steps", "2")
    assert losses(out) == ["3.48839765542", "3.45787773437"]
    assert losses(out) == quoted_losses("engine.md", "hpcpar train --model tiny --dtype float64 --steps 2")


def test_tensor_and_data_parallel_print_the_single_rank_losses():
    one = losses(train(1, "--steps", "5"))
    assert one == quoted_losses("tensor_parallel.md", "hpcpar train --tp 2 --dtype float64 --steps 5")
    tp = train(2, "--tp", "2", "--steps", "5")
    assert losses(tp) == one
    assert "tp 20.1 MB" in tp                  # 2 ranks x (10 MiB + 48 KiB) per step, docs/tensor_parallel.md
    # payload counters: docs/tensor_parallel.md and docs/data_parallel.md explain each number
    for flags, volume in ((["--tp", "2", "--sequence-parallel"], "tp 34.2 MB"), (["--dp", "2"], "dp 1.6 MB"),
                          (["--dp", "2", "--zero1"], "dp 2.4 MB")):
        out = train(2, *flags, "--steps", "5")
        assert losses(out) == one, flags
        assert volume in out, flags


def test_schedule_plot_in_quickstart(tmp_path):
    png = tmp_path / "1f1b.png"
    proc, _ = run(hpcpar() + ["schedule", "--stages", "4", "--microbatches", "8", "--schedule", "1f1b",
                              "--plot", str(png)], timeout=60)
    assert proc.returncode == 0, proc.stderr
    quoted = (DOCS / "quickstart.md").read_text()
    for line in proc.stdout.splitlines()[:-1]:             # all but "wrote <path>"
        assert line in quoted, line
    assert png.stat().st_size > 1000


def test_pipeline_schedules_print_the_single_rank_losses():
    one = losses(train(1, "--layers", "4", "--steps", "3"))
    # the block quotes the one-rank run and the zb-h1 run: the same three losses twice
    assert quoted_losses("pipeline.md", "hpcpar train --layers 4 --dtype float64 --steps 3") == one * 2
    for schedule in ("gpipe", "1f1b", "interleaved", "zb-h1"):
        out = train(2, "--pp", "2", "--layers", "4", "--schedule", schedule, "--microbatches", "4", "--steps", "3")
        assert losses(out) == one, schedule
        assert ("pp 12.0 MB" if schedule == "interleaved" else "pp 4.0 MB") in out


def test_grid_orders_in_3d_doc():
    proc, _ = run(hpcpar() + ["grid", "--tp", "4", "--pp", "2", "--dp", "2", "--world", "16"], timeout=60)
    assert "dp 0: [ 0  1  2  3] -> [ 8  9 10 11]" in proc.stdout
    proc, _ = run(hpcpar() + ["grid", "--tp", "4", "--pp", "2", "--dp", "2", "--world", "16",
                              "--order", "pp-dp-tp"], timeout=60)
    assert re.search(r"^ +0 +0 +0 +0 +0,4,8,12 ", proc.stdout, re.M)


def test_quickstart_plot_snippet(tmp_path):
    """The plotting code of docs/quickstart.md, on a metrics file from a 3-step run."""
    metrics = tmp_path / "tiny.jsonl"
    proc, _ = run(hpcpar() + ["train", "--steps", "3", "--no-progress", "--metrics", str(metrics)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s"} <= set(records[0])
    snippet = next(b for b in python_blocks(DOCS / "quickstart.md") if "matplotlib" in b)
    assert "runs/tiny.jsonl" in snippet and "loss.png" in snippet
    code = snippet.replace("runs/tiny.jsonl", str(metrics)).replace("loss.png", str(tmp_path / "loss.png"))
    proc, _ = run([sys.executable, "-c", code], timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "loss.png").stat().st_size > 1000
