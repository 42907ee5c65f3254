"""Multi-token prediction on one rank, float64: the shifted targets (and the hook that keeps a shift inside its
document), every gradient against finite differences with two modules (DeepSeek's blocks, and GPT-2's with
its tied embedding: the head, the lookup and the token table one parameter), the reported loss as the
definition gives it, and the options refused."""
from dataclasses import replace

import numpy as np
import pytest

from gradcheck import assert_grad
from hpcpar.nn import GPT
from hpcpar.nn.gpt import preset
from hpcpar.nn.mtp import mtp_targets
from hpcpar.runtime import UsageError
from test_mla import CFG as DEEPSEEK, model_of
from test_nn import batch
from train_helpers import config

GPT2 = preset("tiny", vocab_size=23, seq_len=8, n_layer=1, d_model=16, n_head=2, mtp_depth=2, mtp_lambda=1.0)


def test_targets_shift_and_stop_at_the_end_and_at_documents():
    y = np.arange(12).reshape(2, 6)
    t = mtp_targets(y, 2)
    np.testing.assert_array_equal(t[0], y)
    np.testing.assert_array_equal(t[2, 0], [2, 3, 4, 5, -1, -1])
    docs = np.array([[0, 0, 0, 1, 1, 1, 1]] * 2)     # the inputs' and the last target's: tokens 3.. a new document
    np.testing.assert_array_equal(mtp_targets(y, 2, docs)[1, 1], [7, -1, -1, 10, 11, -1])   # token t predicts t + 2
    np.testing.assert_array_equal(mtp_targets(y, 2, docs)[2, 1], [-1, -1, -1, 11, -1, -1])


@pytest.mark.parametrize("cfg", [replace(DEEPSEEK, mtp_depth=2, mtp_lambda=1.0), GPT2], ids=["deepseek", "gpt2-tied"])
def test_mtp_gradients_match_finite_differences(cfg):
    model = model_of(cfg)
    x, y = batch(cfg, B=1)                                     # a small loss: little round-off
    t = mtp_targets(y, cfg.mtp_depth)

    def loss():
        return model.forward(x, None, t)[0] + _mtp_loss(model, x, t)
    model.zero_grad()
    main, caches = model.forward(x, None, t)
    model.backward(1.0, caches)
    want = _mtp_loss(model, x, t)
    assert model.head.mtp.take_loss_sum() == pytest.approx(want, rel=1e-12)     # reported as defined
    if cfg.tied:
        assert model.head.weight is model.embed.wte is model.head.mtp.embed.wte
    # the MTP modules' own parameters, the shared ones, and a weight of each block (test_mla.py checks the
    # blocks' every parameter); the routers' gradients are ~1e-5, the differences' round-off 1e-10
    own = ("enorm", "hnorm", "eh_proj", "shared_head", "embed", "wte", "lm_head", "norm.weight", "o_proj",
           "c_proj", "gate.weight")
    for p in model.parameters():
        if p.name.startswith(own) or any(f".{o}" in p.name for o in own):
            assert_grad(loss, p.data, p.grad, p.name, rtol=1e-5, n=4)


def _mtp_loss(model, x, t):
    """(lambda / D) sum_k L_k written out from the definition: module k reads h^{k-1} and E t_{i+k}."""
    from hpcpar.ops.cross_entropy import cross_entropy_forward
    cfg, mtp = model.cfg, model.head.mtp
    h = model.embed.forward(x)[0]
    for b in model.blocks:
        h = b.forward(h)[0]
    h = model.head.ln_f.forward(h)[0]
    total = 0.0
    for k, m in enumerate(mtp.depths, 1):
        h = m.forward(mtp.embed.wte.data[np.maximum(t[k - 1], 0)], h, None)[0]
        losses = cross_entropy_forward(h.reshape(-1, cfg.d_model) @ model.head.weight.data.T,
                                       np.maximum(t[k], 0).reshape(-1))[0]
        total += (losses * (t[k] >= 0).reshape(-1)).sum()
    return cfg.mtp_lambda / cfg.mtp_depth * total


def test_mtp_options_are_refused_without_a_model_for_them():
    from hpcpar.training.models import model_config
    from hpcpar.training.config import check
    with pytest.raises(UsageError, match="--mtp needs a GPT"):
        model_config(check(config(dims=dict(model="mlp", mtp=1)), 1))
    with pytest.raises(UsageError, match="--mtp 8 leaves no target"):
        model_config(check(config(dims=dict(model="deepseek-tiny", seq_len=8, mtp=8)), 1))
