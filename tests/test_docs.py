"""The docs' commands and code blocks still do what the docs say they do.

* every ```console block of docs/ (and docs/course/) prints what it quotes, within the tolerance of
  hpcpar/tools/quotes/compare.py (timings masked, round-off compared by size); blocks marked slow (minutes
  of training) are left to `make docs`;
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

from docs_session import docs_session
from hpcpar.tools.quotes.blocks import blocks
from hpcpar.tools.quotes.compare import DRIFT, MACHINE_ONLY, align, line_difference
from hpcpar.tools.quotes.pages import check_page
from mpitools import hpcpar, run, run_mpi

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(DOCS.glob("*.md")) + sorted(DOCS.glob("course/*.md"))
QUOTING = [p for p in PAGES if any(not b.slow for b in blocks(p))]


@pytest.mark.parametrize("page", QUOTING, ids=[str(p.relative_to(DOCS)) for p in QUOTING])
def test_quoted_outputs_are_current(page):
    """`make docs` would change nothing in this page's console blocks (slow ones aside)."""
    _, problems, checked = check_page(docs_session(), page, slow=False)
    assert checked and not problems, (f"{len(problems)} stale quotes in {page.name} "
                                      "(make docs rewrites them):\n" + "\n".join(problems))


def test_every_command_block_is_a_checked_console_block():
    """A fenced block that shows a prompt and its output must be a console block, or nothing checks it."""
    for page in PAGES:
        text = page.read_text()
        for info, body in re.findall(r"^```([^\n]*)\n(.*?)^```", text, re.S | re.M):
            if body.startswith("$ "):
                assert info.split()[:1] == ["console"], f"{page.name}: a $-block not tagged console: {body[:60]!r}"


def test_quote_tolerance():
    # round-off: both below 1e-8, other BLAS, other digits
    assert line_difference("max relative difference 1.6e-15", "max relative difference 1.5e-15") is None
    assert line_difference("max relative difference 1.6e-15", "max relative difference 2.0e-3") is not None
    # figures of the machine are masked; the rest is checked
    quoted = "MFU  4.5% of the GEMM rate measured on these 8 ranks (1110.0 GFLOP/s together; 83.95 GFLOP per step)"
    fresh = "MFU  27.9% of the GEMM rate measured on these 8 ranks (133.9 GFLOP/s together; 83.95 GFLOP per step)"
    assert line_difference(quoted, fresh) is None
    assert line_difference(quoted, fresh.replace("83.95", "84.10")) is not None
    assert line_difference("step 100/1000  loss 2.97223901749  51.5 ms",
                           "step 100/1000  loss 2.97223937511  101.0 ms") is None
    assert line_difference("step 100/1000  loss 2.97223901749", "step 100/1000  loss 2.9731") is not None
    # a drift block (a long float32 run): 1e-2 relative, as between two CPUs after 1000 steps
    long_run = "step  1000/1000  loss 0.988394141197  grad_norm 0.5469"
    assert line_difference(long_run, "step  1000/1000  loss 0.988747477531  grad_norm 0.5487") is not None
    assert line_difference(long_run, "step  1000/1000  loss 0.988747477531  grad_norm 0.5487", DRIFT) is None
    assert line_difference(long_run, "step  1000/1000  loss 1.0012  grad_norm 0.5469", DRIFT) is not None
    # a machine block: any decimal, integers still exactly
    assert line_difference("fit 0.71 over 12 runs", "fit 0.93 over 12 runs", MACHINE_ONLY) is None
    assert line_difference("fit 0.71 over 12 runs", "fit 0.71 over 13 runs", MACHINE_ONLY) is not None
    # integers exactly; a decimal to one unit of its last digit
    assert line_difference("pp 4.0 MB in 16 messages", "pp 4.0 MB in 17 messages") is not None
    assert line_difference("(entropy floor 0.911941: +8.4%)", "(entropy floor 0.911941: +8.5%)") is None
    assert line_difference("the text", "other text") == "the text differs"


def test_quote_alignment_finds_new_and_missing_lines():
    fresh = ["hpcpar train: 5 steps", "  loss 3.38972", "  comm time   tp 1.0 ms", "  parameters  106,240"]
    # a quote without "..." is complete: the new comm time line makes it stale, and the rewrite adds it
    new, differences = align(["hpcpar train: 5 steps", "  loss 3.38972", "  parameters  106,240"], fresh)
    assert new == fresh and differences
    # "..." leaves lines out on purpose
    new, differences = align(["hpcpar train: 5 steps", "...", "  parameters  106,240"], fresh)
    assert new == ["hpcpar train: 5 steps", "...", "  parameters  106,240"] and not differences


def test_make_docs_rewrites_a_stale_quote(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```console\n$ printf 'a 1\\nb 2\\n'\na 1\nb 3\n```\n\nMore text.\n")
    proc, _ = run([sys.executable, "-m", "hpcpar.tools.quotes", "--check", str(page)], timeout=60)
    assert proc.returncode == 1 and "2 != 3" not in proc.stdout and "3 != 2" in proc.stdout
    proc, _ = run([sys.executable, "-m", "hpcpar.tools.quotes", str(page)], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert page.read_text() == "Text.\n\n```console\n$ printf 'a 1\\nb 2\\n'\na 1\nb 2\n```\n\nMore text.\n"


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


def test_context_parallel_doc_quotes_the_single_rank_losses():
    """docs/context_parallel.md quotes one rank and cp 2 in one block (each checked current above):
    the same losses, to the 12 digits printed."""
    both = quoted_losses("context_parallel.md", "hpcpar train --steps 3 --dtype float64 --seq-len 16")
    assert len(both) == 6 and both[:3] == both[3:]
    assert quoted_losses("context_parallel.md", "hpcpar train --cp 2 --steps 3") == both[3:]
    assert quoted_losses("context_parallel.md", "hpcpar train --cp 2 --cp-kind ulysses --steps 3") == both[3:]


def test_schedule_plot_writes_a_png(tmp_path):
    png = tmp_path / "1f1b.png"
    proc, _ = run(hpcpar() + ["schedule", "--stages", "4", "--microbatches", "8", "--schedule", "1f1b",
                              "--plot", str(png)], timeout=60)
    assert proc.returncode == 0, proc.stderr
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
