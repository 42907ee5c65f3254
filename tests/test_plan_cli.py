"""``hpcpar plan``: the ranked table, --explain, --plot and refusals (``plan calibrate``:
test_plan_validation.py; ``plan local``: test_plan_local.py)."""

import pytest

from hpcpar.cli import main

GPT3 = ["plan", "--model", "gpt3-175b", "--gpus", "1024", "--gpus-per-node", "8", "--hardware", "a100",
        "--global-batch", "1536", "--seq-len", "2048"]


def test_ranked_table_and_explain_top(capsys, tmp_path):
    png = tmp_path / "plan.png"
    assert main(GPT3 + ["--top", "3", "--explain", "top", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "layouts divide the job" in out and out.count("interleaved") + out.count("1f1b") >= 3
    for term in ("MEMORY", "optimizer state", "activations", "GEMM", "element-wise", "TP all-reduce",
                 "PIPELINE", "simulated", "textbook bubble", "DATA PARALLEL", "OPTIMIZER", "MFU"):
        assert term in out
    assert png.stat().st_size > 10_000


def test_explain_a_given_layout(capsys):
    assert main(GPT3 + ["--explain", "tp8-pp8-dp16-mb1-v1-1f1b-rcfull"]) == 0
    out = capsys.readouterr().out
    assert "LAYOUT tp8-pp8-dp16-mb1-v1-1f1b-rcfull" in out and "recompute forward" in out


@pytest.mark.parametrize("extra, message", [
    (["--explain", "tp8-pp8-dp8-mb1-v1-1f1b"], "not the 1024 GPUs"),
    (["--explain", "tp8-pp8-dp16-mb1-v1-foo"], "cannot read"),
    (["--hardware", "tpu"], "unknown hardware"),
    (["--model", "nope"], "unknown model"),
])
def test_bad_input_exits_2_with_one_line(capsys, extra, message):
    args = GPT3 + extra if extra[0] != "--model" else ["plan", "--gpus", "8", "--global-batch", "8",
                                                      "--seq-len", "64"] + extra
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_missing_flags_exit_2(capsys):
    assert main(["plan", "--model", "gpt2"]) == 2
    assert "--gpus" in capsys.readouterr().err


def test_nothing_fits(capsys):
    assert main(["plan", "--model", "gpt3-175b", "--gpus", "8", "--global-batch", "8", "--seq-len", "2048"]) == 2
    assert "no layout fits" in capsys.readouterr().err
