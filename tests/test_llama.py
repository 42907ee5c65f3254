"""Llama blocks on one rank: whole-model gradients against finite differences, the B/W split and
recomputation, rotary positions taken from the context, parameter and FLOP counts, refused layouts
(the refusal on the command line, one line before any rank communicates, is quoted in docs/llama.md
and checked by test_docs)."""
from dataclasses import replace

import numpy as np
import pytest

from gradcheck import assert_grad
from hpcpar.training.config import check
from hpcpar.flops import gpt_block_forward_flops
from hpcpar.nn import GPT, Context, GPTConfig
from hpcpar.runtime import UsageError
from hpcpar.training.models import model_config
from test_docs import quoted_losses
from test_nn import batch, grads
from train_helpers import config

# 4 query heads reading 2 K/V heads, an F that is not 4C: every Llama-specific shape in play
CFG = GPTConfig(vocab_size=23, seq_len=8, n_layer=2, n_head=4, n_kv_head=2, d_model=16, d_ff=24, arch="llama",
                tied=False, ln_eps=1e-6)
QK_NORM = replace(CFG, qk_norm=True)        # Qwen3's attention: q and k normalised per head before RoPE
WIDE = replace(QK_NORM, head_dim=6)         # Qwen3's heads: NH*HS = 24 is not C = 16 (q, k, v, o all change)


def with_random_gains(model):
    """QK-norm's gains start at one; drawn at random a misplaced gain cannot hide."""
    rng = np.random.default_rng(4)
    for p in model.parameters():
        if p.name.endswith(("q_norm.weight", "k_norm.weight")):
            p.data[:] = 1 + 0.3 * rng.standard_normal(p.data.shape)
    return model


@pytest.mark.parametrize("cfg", [CFG, QK_NORM, WIDE], ids=["llama", "qk-norm", "head-dim"])
def test_llama_gradients_match_finite_differences(cfg):
    model = with_random_gains(GPT(cfg, seed=3, dtype="float64"))
    x, y = batch(cfg)
    _, g = grads(model, x, y)
    assert not any(p.name.endswith(".bias") for p in model.parameters())
    for p in model.parameters():
        assert_grad(lambda: model.forward(x, None, y)[0], p.data, g[p.name], p.name, n=6)


@pytest.mark.parametrize("cfg", [CFG, QK_NORM, WIDE], ids=["llama", "qk-norm", "head-dim"])
def test_split_backward_and_recompute_give_the_same_gradients(cfg):
    model = with_random_gains(GPT(cfg, seed=1, dtype="float64"))
    x, y = batch(cfg)
    _, plain = grads(model, x, y)
    work = []
    grads(model, x, y, defer=work)
    for fn in work:                    # the W pass, later
        fn()
    split = {p.name: p.grad.copy() for p in model.parameters()}
    model.set_recompute(True)
    _, again = grads(model, x, y)
    for name, g in plain.items():      # bit for bit: the same products, run later or run twice
        np.testing.assert_array_equal(split[name], g)
        np.testing.assert_array_equal(again[name], g)


def arrays(cache):
    """Every array a (nested) cache holds."""
    if isinstance(cache, np.ndarray):
        return [cache]
    if isinstance(cache, (tuple, list)):
        return [a for c in cache for a in arrays(c)]
    return []


@pytest.mark.parametrize("cfg", [CFG, GPTConfig(vocab_size=23, seq_len=8, n_layer=2, n_head=4, d_model=16,
                                                dropout=0.3)], ids=["llama", "gpt2-dropout"])
def test_selective_recompute_keeps_no_probabilities_and_gives_the_same_gradients(cfg):
    model = GPT(cfg, seed=1, dtype="float64")
    x, y = batch(cfg)
    ctx = Context(step=2, seed=9)
    _, plain = grads(model, x, y, ctx)
    T = cfg.seq_len
    kept = model.forward(x, ctx, y)[1]
    assert any(a.shape[-2:] == (T, T) for a in arrays(kept))              # P, and the dropout mask
    model.set_recompute(False, attention=True)
    kept = model.forward(x, ctx, y)[1]
    assert not any(a.shape[-2:] == (T, T) for a in arrays(kept))          # only q, k, v of the core
    _, again = grads(model, x, y, ctx)
    for name, g in plain.items():      # bit for bit: the core's forward repeated, the same mask redrawn
        np.testing.assert_array_equal(again[name], g)


def test_rotary_positions_come_from_the_context():
    """The last 4 tokens of a sequence, told their positions 4..7, give the hidden states the whole
    sequence gives them - as long as they see their own past only through the block's attention."""
    model = GPT(CFG, seed=2, dtype="float64")
    x, _ = batch(CFG)
    block = model.blocks[0].attn
    h = np.random.default_rng(0).standard_normal((3, 8, 16))
    whole, _ = block.forward(h)
    alone, _ = block.forward(h[:, 4:], Context(positions=np.arange(4, 8)))
    shifted, _ = block.forward(h[:, 4:], Context(positions=np.arange(104, 108)))
    # attention within the last 4 tokens depends on position differences only: any offset gives the
    # same output (round-off of the larger angles aside), and it differs from the whole sequence's,
    # whose last tokens also attend to the first four
    np.testing.assert_allclose(shifted, alone, rtol=1e-9, atol=1e-12)
    assert not np.allclose(alone, whole[:, 4:])


def test_parameter_and_flop_counts():
    model = GPT(CFG, seed=0, dtype="float64")
    assert sum(p.data.size for p in model.parameters()) == CFG.n_params()
    qk = sum(p.data.size for p in GPT(QK_NORM, seed=0, dtype="float64").parameters())
    assert qk == QK_NORM.n_params() == CFG.n_params() + 2 * 2 * 4        # two gains of HS = 4 per layer
    C, F, kv, T = 16, 24, 2 * 4, 8                    # K/V width: 2 heads of 4
    assert gpt_block_forward_flops(CFG) == 2 * (2 * C * C + 2 * C * kv + 3 * C * F) + 4 * T * C
    gpt = GPTConfig(vocab_size=23, seq_len=8, n_layer=2, n_head=4, d_model=16)
    assert gpt_block_forward_flops(gpt) == 2 * (4 * C * C + 2 * C * 4 * C) + 4 * T * C     # unchanged
    wide = sum(p.data.size for p in GPT(WIDE, seed=0, dtype="float64").parameters())
    A, kv = 4 * 6, 2 * 6                              # heads of 6: queries 24 wide, K/V 12
    assert wide == WIDE.n_params() == QK_NORM.n_params() + 2 * (2 * C * (A - C) + 2 * C * (kv - 8) + 2 * 2)
    assert gpt_block_forward_flops(WIDE) == 2 * (2 * C * A + 2 * C * kv + 3 * C * F) + 4 * T * A


def test_presets_are_llama():
    mcfg = model_config(check(config(model="llama-tiny", layers=0, hidden=0, heads=0, seq_len=0), 1))
    assert (mcfg.arch, mcfg.n_head, mcfg.n_kv_head, mcfg.tied) == ("llama", 4, 2, False)


@pytest.mark.parametrize("flags, message", [
    (dict(tp=4, heads=4, kv_heads=2), "--tp 4 must divide the number of key/value heads (2)"),
    (dict(heads=4, kv_heads=3), "--kv-heads 3 must divide the 4 attention heads"),
    (dict(dropout=0.1), "has no dropout"),
    (dict(model="tiny", kv_heads=2), "--kv-heads needs a Llama model"),
    (dict(model="tiny", head_dim=16), "--head-dim needs a Llama model"),
    (dict(head_dim=7), "head_dim 7 is odd: rotary positions turn pairs of a head's features"),
])
def test_layouts_that_cannot_split_are_refused(flags, message):
    kw = dict(dict(model="llama-tiny", hidden=32, seq_len=8), **flags)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        model_config(check(config(**kw), kw.get("tp", 1)))


def test_a_gpt2_config_refuses_what_its_attention_lacks():
    """GPT-2's attention has heads of d_model / n_head and no QK-norm: a config asking for either is
    refused where it is made, not counted in its shape and silently ignored by its arrays."""
    from hpcpar.nn.gpt import preset
    for flags, what in ((dict(head_dim=32), "--head-dim"), (dict(qk_norm=True), "QK-norm")):
        with pytest.raises(UsageError, match=f"{what} needs a Llama model"):
            preset("tiny", **flags)


def test_the_worked_example_quotes_the_same_losses_on_one_rank_and_eight():
    """docs/llama.md's two runs (each kept current by test_docs) print identical loss lines."""
    one = quoted_losses("llama.md", "hpcpar train --model llama-tiny --dtype float64 --steps 3")
    eight = quoted_losses("llama.md", "hpcpar train --model llama-tiny --tp 2 --pp 2 --dp 2 --dtype float64")
    assert len(one) == 3 and one == eight
