"""Training with experts on one rank: hpcpar train's options reach the model, a batch is learnt, the step
reports the experts' load (and the routing bias moves by DeepSeek-V3's rule), bad options are refused
in one line before anything runs."""
import numpy as np
import pytest

from train_helpers import config, free, trainer
from hpcpar.runtime import UsageError
from hpcpar.training.models import model_config

MOE_DIMS = dict(model="moe-tiny", layers=2, hidden=16, heads=2, ffn=24, seq_len=8, synthetic_vocab=29,
                batch_size=8)
MIXTRAL_DIMS = dict(MOE_DIMS, model="mixtral-tiny", kv_heads=1)


@pytest.fixture
def comm():
    from mpi4py import MPI
    return MPI.COMM_SELF


@pytest.mark.parametrize("dims", [MOE_DIMS, MIXTRAL_DIMS], ids=["gpt2", "llama"])
def test_training_with_experts_lowers_the_loss_and_reports_the_load(comm, dims):
    t = trainer(comm, dims=dims, lr=1e-2, steps=12, shared_experts=1, aux_loss_coef=0.01, capacity_factor=1.25,
                bias_rate=1e-3)
    losses = [t.step(0).loss for _ in range(12)]          # one batch again and again: it is learnt
    assert losses[-1] < losses[0] - 0.5
    e = t.experts
    N = 8 * 8                                               # tokens per step
    assert e["load_mean"] == N * 2 / 4                      # an even share of N k choices over 4 experts
    assert e["load_min"] <= e["load_mean"] <= e["load_max"] and 0 <= e["dropped"] <= N * 2 * 2
    assert 2 <= e["effective_experts"] <= 4 and e["aux_loss"] > 0
    bias = [m.mlp.bias.data for m in t.chunks[0].blocks]
    assert all(np.all(np.abs(b) <= 12 * 1e-3 + 1e-12) for b in bias) and any(np.any(b != 0) for b in bias)
    free(t)


def test_the_bias_follows_the_step_counts(comm):
    t = trainer(comm, dims=MOE_DIMS, bias_rate=0.5, lr=1e-12)
    t.step(0)
    moe = t.chunks[0].blocks[0].mlp
    counts = t.expert_load.layers[0].stats.counts          # cleared after the step
    assert counts.sum() == 0
    b = moe.bias.data
    assert set(np.round(np.abs(b), 12)) <= {0.5, 0.0}    # one step of +-rate (0 for an even expert)
    free(t)


@pytest.mark.parametrize("kw, message", [
    (dict(top_k=5), "--top-k 5 is more than the 4 experts"),
    (dict(capacity_factor=1.0, cp=2), "--aux-loss-coef and --capacity-factor count a micro-batch's tokens"),
    (dict(model="tiny", aux_loss_coef=0.1), "--aux-loss-coef needs experts"),
    (dict(export="out.safetensors"), "a GPT-2 with experts has no Hugging Face model"),
    (dict(model="tiny", norm_topk=False), "--no-norm-topk needs experts"),
    (dict(model="mixtral-tiny", kv_heads=1, norm_topk=False, export="out"), "a Llama with experts whose top-k "
                                                                            "scores are not renormalised"),
    (dict(ep=3), "--ep 3 must divide the 4 experts"),
    (dict(ep=2), r"--ep 2 must divide dp x cp = 1 x 1 = 1"),
    (dict(model="tiny", ep=2), "--ep needs experts"),
])
def test_bad_options_are_refused_in_one_line(kw, message):
    cfg = config(dims=MOE_DIMS, **kw)
    cfg.dp, cfg.chunks = 1, 1
    with pytest.raises(UsageError, match=message):
        model_config(cfg)


def test_zero3_with_experts_is_accepted():
    """ZeRO-3 slices the experts over their own group and keeps the routing bias whole on every rank
    (tests/test_zero_mpi.py runs both)."""
    cfg = config(dims=MOE_DIMS, dp=4, ep=2, zero=3, bias_rate=0.01)
    assert model_config(cfg).n_expert == 4


def test_the_memory_formula_keeps_the_routing_bias_whole_under_zero3():
    """ZeRO-3 slices a block's router over dp x cp but keeps its routing bias (E numbers) whole on every
    rank: the formula counts the bias at ZeRO-0's rate, weights + gradient + AdamW's 2 moments (float64, 8 bytes)."""
    from dataclasses import replace
    from hpcpar.data_parallel.zero_memory import formula
    from hpcpar.training.config import check
    kw = dict(dims=MOE_DIMS, dp=4, ep=2, zero=3)
    terms = []
    for rate in (0.0, 0.01):
        cfg = check(config(bias_rate=rate, **kw), 4)
        terms.append(formula(cfg, replace(model_config(cfg), vocab_size=29)))
    layers, experts = 2, 4
    assert sum(terms[1].values()) - sum(terms[0].values()) == layers * experts * (8 + 8 + 2 * 8)
    assert terms[1]["ZeRO working set"] == terms[0]["ZeRO working set"]          # never gathered


def test_capacity_factor_must_not_be_negative():
    from hpcpar.training.config import check
    with pytest.raises(UsageError, match="--capacity-factor must not be negative"):
        check(config(dims=MOE_DIMS, capacity_factor=-1.0), 1)


def test_the_chapter_quotes_the_single_rank_losses_under_dp_and_ep():
    """docs/moe.md quotes one rank, dp 2 and dp 2 x ep 2 (each block checked current by test_docs)."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "docs" / "moe.md").read_text()
    runs = [re.findall(r"^step +\d+/3  loss (\S+)", block, re.M)
            for block in re.findall(r"```console\n(\$ [^\n]*--model moe-tiny[^\n]*--steps 3.*?)```", text, re.S)]
    assert len(runs) == 3 and runs[0] and runs[0] == runs[1] == runs[2]
