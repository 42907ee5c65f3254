"""Modules and whole models: finite differences, the B/W split, recomputation, stages, init."""
import numpy as np
import pytest

from gradcheck import assert_grad
from hpcpar.nn import GPT, Context, GPTConfig, MLPConfig, MLPModel
from hpcpar.nn.stage import StageHooks

CFG = GPTConfig(vocab_size=23, seq_len=8, n_layer=2, n_head=2, d_model=8, dropout=0.0)


def batch(cfg=CFG, B=3, seed=0):
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(B, cfg.seq_len + 1))
    return ids[:, :-1], ids[:, 1:]


def grads(model, x, y, ctx=None, dloss=1.0, **kw):
    model.zero_grad()
    loss, caches = model.forward(x, ctx, y)
    model.backward(dloss, caches, **kw)
    return loss, {p.name: p.grad.copy() for p in model.parameters()}


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_gpt_gradients_match_finite_differences(tied, dropout):
    cfg = GPTConfig(**{**CFG.__dict__, "tied": tied, "dropout": dropout})
    model = GPT(cfg, seed=3, dtype="float64")
    x, y = batch(cfg)
    ctx = Context(step=1, seed=5)
    _, g = grads(model, x, y, ctx)
    for p in model.parameters():
        assert_grad(lambda: model.forward(x, ctx, y)[0], p.data, g[p.name], p.name, n=6)


def test_mlp_model_gradients_match_finite_differences():
    cfg = MLPConfig(d_in=5, d_model=6, d_ff=10, n_layer=3, d_out=4)
    model = MLPModel(cfg, seed=1, dtype="float64")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((7, 5)), rng.standard_normal((7, 4))
    _, g = grads(model, x, y)
    for p in model.parameters():
        assert_grad(lambda: model.forward(x, None, y)[0], p.data, g[p.name], p.name, n=6)


def test_split_backward_equals_full_backward():
    """B now and W later (zero-bubble) gives exactly the gradients of one backward."""
    model = GPT(CFG, seed=1, dtype="float64")
    x, y = batch()
    _, full = grads(model, x, y)
    model.zero_grad()
    loss, caches = model.forward(x, None, y)
    work = []
    model.backward(1.0, caches, defer=work)
    assert all(not p.grad.any() for p in model.parameters() if p.name.endswith(".weight")
               and "ln" not in p.name)          # nothing accumulated yet
    for fn in work:
        fn()
    for p in model.parameters():       # bit for bit: the same products, only run later
        np.testing.assert_array_equal(p.grad, full[p.name])


def test_recompute_gives_identical_gradients():
    cfg = GPTConfig(**{**CFG.__dict__, "dropout": 0.1})
    model = GPT(cfg, seed=1, dtype="float64")
    x, y = batch()
    ctx = Context(step=2, seed=9)
    _, plain = grads(model, x, y, ctx)
    model.set_recompute(True)
    _, again = grads(model, x, y, ctx)
    for name, g in plain.items():      # bit for bit: recomputing repeats the same forward
        np.testing.assert_array_equal(again[name], g)


def test_stages_chained_equal_the_whole_model():
    """Three stages (embed+block0 | block1 | head) in a row compute the single model exactly."""
    whole = GPT(CFG, seed=4, dtype="float64")
    x, y = batch()
    loss, g = grads(whole, x, y)
    cfg = CFG
    stages = [GPT(cfg, 4, "float64", layers=[0], first=True, last=False),
              GPT(cfg, 4, "float64", layers=[1], first=False, last=False),
              GPT(cfg, 4, "float64", layers=[], first=False, last=True)]
    h, caches = x, []
    for s in stages:
        h, c = s.forward(h, None, y)
        caches.append(c)
    assert h == loss                   # bit for bit: each stage runs the whole model's operations as they are
    d = 1.0
    for s, c in zip(reversed(stages), reversed(caches)):
        d = s.backward(d, c)
    tied = stages[0].embed.wte.grad + stages[2].head.weight.grad   # the two copies' gradients summed
    np.testing.assert_allclose(tied, g["wte.weight"], rtol=1e-13)
    for s in stages:
        for p in s.parameters():
            if p.name != "wte.weight":
                np.testing.assert_array_equal(p.grad, g[p.name])


class Reports(StageHooks):
    """The model's door (nn/stage.py) doing nothing but handing what the stage reports final to ``report``."""

    def __init__(self, report):
        self.grads_ready = lambda params: report(list(params))


def test_grads_ready_reports_each_parameter_once_after_its_last_use():
    model = GPT(CFG, seed=0, dtype="float64")
    x, y = batch()
    loss, caches = model.forward(x, None, y)
    order = []
    model.hooks = Reports(lambda ps: order.extend(p.name for p in ps))
    model.backward(1.0, caches, final=True)
    assert sorted(order) == sorted(p.name for p in model.parameters())
    assert order[-2:] == ["wte.weight", "wpe.weight"]     # the tied weight: final at the embedding
    assert order[0] == "ln_f.weight"


def test_initialisation_is_gpt2_and_deterministic():
    cfg = GPTConfig(vocab_size=50, seq_len=16, n_layer=6, n_head=4, d_model=64)
    a, b = GPT(cfg, seed=7, dtype="float64"), GPT(cfg, seed=7, dtype="float64")
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    params = {p.name: p.data for p in a.parameters()}
    assert abs(params["h.0.mlp.c_fc.weight"].std() - 0.02) < 0.002
    assert abs(params["h.0.mlp.c_proj.weight"].std() - 0.02 / np.sqrt(12)) < 0.0005
    assert not params["h.0.attn.c_attn.bias"].any() and (params["ln_f.weight"] == 1).all()
    # one parameter's values do not depend on which others exist (a pipeline stage builds a subset)
    stage = GPT(cfg, seed=7, dtype="float64", layers=[3], first=False, last=False)
    np.testing.assert_array_equal(stage.blocks[0].attn.c_attn.weight.data, params["h.3.attn.c_attn.weight"])
    assert cfg.n_params() == sum(p.data.size for p in a.parameters())
