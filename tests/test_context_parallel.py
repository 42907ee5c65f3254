"""Context parallelism from the command line: a bad cp size is one clear line, before any rank
communicates; a Llama at tp 2 x cp 2 x pp 2 prints one rank's losses."""
import re

import pytest

from hpcpar.training.config import check
from hpcpar.runtime import UsageError
from hpcpar.training.models import model_config
from mpitools import hpcpar, run_mpi
from train_helpers import GPT_DIMS, LLAMA_DIMS, config, rel_err


@pytest.mark.parametrize("kw, world, msg", [
    (dict(cp=2, seq_len=10), 2, "the sequence length 10 must divide into 2 x cp = 4 equal chunks"),
    (dict(cp=3, dp=0, seq_len=12), 2, "tp x cp x pp = 1 x 3 x 1 = 3 does not divide the world size 2"),
    (dict(cp=2, dp=2, seq_len=16), 2, "tp x cp x pp x dp = 1 x 2 x 1 x 2 = 4 does not match the world size 2"),
    (dict(cp=2, tp=4, seq_len=12, sequence_parallel=True), 8, "--tp 4 must divide each rank's 6 tokens"),
    (dict(cp=2, dropout=0.1), 2, "use --dropout 0"),
    (dict(cp=2, dtype="float32", precision="bf16"), 2, "use --precision fp32"),
    (dict(cp=2, dims=dict(model="mlp", layers=2)), 2, "--cp needs a GPT model"),
    (dict(cp=0), 1, "--cp must be at least 1"),
    (dict(cp=3, cp_kind="ulysses", seq_len=12), 3,
     "--cp-kind ulysses --cp 3: the 8 attention heads must divide by cp"),
    (dict(cp=4, tp=2, cp_kind="ulysses", dims=dict(GPT_DIMS, heads=4, seq_len=16)), 8,
     "--cp-kind ulysses --cp 4: the 4 attention heads / tp 2 = 2 per tp rank must divide by cp"),
    (dict(cp=4, cp_kind="ulysses", dims=dict(LLAMA_DIMS, seq_len=16)), 4,
     "--cp-kind ulysses --cp 4: the 2 key/value heads must divide by cp"),
    (dict(cp=2, cp_kind="tree"), 2, "--cp-kind"),
])
def test_bad_context_parallel_sizes_are_refused(kw, world, msg):
    with pytest.raises(UsageError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        model_config(check(config(**kw), world))


def test_refusal_is_one_line_before_any_rank_communicates():
    proc, seconds = run_mpi(2, hpcpar() + ["train", "--cp", "2", "--seq-len", "10", "--steps", "1"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "hpcpar: error: --cp 2: the sequence length 10 must divide into 2 x cp = 4 equal chunks (each rank holds "
        "one early and one late chunk)"]
    assert seconds < 30         # no rank waits for another (a hang bound with room for a busy machine)


def test_llama_at_tp2_cp2_pp2_prints_the_single_rank_losses():
    """The command line itself, on 8 ranks against one: Llama blocks, rotary positions by global
    position, the ring under tensor and pipeline parallelism (float64; 12 printed digits)."""
    flags = ["train", "--model", "llama-tiny", "--steps", "3", "--dtype", "float64", "--no-progress",
             "--log-every", "1"]
    one, _ = run_mpi(1, hpcpar() + flags, timeout=120)
    eight, _ = run_mpi(8, hpcpar() + flags + ["--tp", "2", "--cp", "2", "--pp", "2"], timeout=300)
    assert one.returncode == 0 and eight.returncode == 0, one.stderr + eight.stderr
    want, got = (re.findall(r"^step +\d+/\d+  loss (\S+)", p.stdout, re.M) for p in (one, eight))
    assert len(want) == 3 and rel_err([float(x) for x in got], [float(x) for x in want]) <= 1e-10, (got, want)
