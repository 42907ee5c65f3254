"""DeepSeek-V3's multi-head latent attention and its block on one rank, float64: every gradient against finite
differences (queries through their latent or straight from x, values narrower and wider than the q/k heads,
YaRN), the B/W split and both recomputations bit for bit, generation from the cached latent equal to the
training forward, group-limited routing with the scaling factor, and the parameter count of the arrays."""
from dataclasses import replace

import numpy as np
import pytest

from gradcheck import assert_grad
from hpcpar.nn import GPT, GPTConfig
from hpcpar.nn.gpt import preset
from hpcpar.ops.mla import mla_heads_backward, mla_heads_forward
from hpcpar.ops.rope import deinterleave, interleave, rope_tables
from hpcpar.ops.router import router_backward, router_forward
from hpcpar.ops.yarn import Yarn
from hpcpar.runtime import UsageError
from test_nn import batch, grads

CFG = preset("deepseek-tiny", vocab_size=23, seq_len=8, d_model=16, n_layer=2, d_ff=12, d_ff_dense=20,
             q_lora_rank=10, kv_lora_rank=8, head_dim=10, qk_rope_dim=4, v_head_dim=6)
NO_Q_LORA = replace(CFG, q_lora_rank=0, rope_interleave=False)
WIDE_V = replace(CFG, v_head_dim=14, yarn=Yarn(factor=4.0, original_positions=4, beta_fast=4, beta_slow=1,
                                                 mscale=0.7, mscale_all_dim=1.0))
CASES = {"q-lora": CFG, "q-proj": NO_Q_LORA, "wide-v-yarn": WIDE_V}


def model_of(cfg, seed=3):
    """Random norm gains (ones at initialisation: a misplaced one cannot hide), a router with opinions, and
    queries large enough for attention far from uniform (its gradients then well above round-off)."""
    model = GPT(cfg, seed=seed, dtype="float64")
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        if p.name.endswith("norm.weight"):
            p.data[:] = 1 + 0.3 * rng.standard_normal(p.data.shape)
        elif p.name.endswith("gate.weight"):
            p.data[:] = 0.5 * rng.standard_normal(p.data.shape)
        elif p.name.endswith(("q_b_proj.weight", "q_proj.weight", "kv_b_proj.weight")):
            p.data *= 5
    return model


@pytest.mark.parametrize("cfg", list(CASES.values()), ids=list(CASES))
def test_deepseek_gradients_match_finite_differences(cfg):
    model = model_of(cfg)
    x, y = batch(cfg)
    _, g = grads(model, x, y)
    for p in model.parameters():
        if p.name.endswith("e_score_correction_bias"):
            assert not g[p.name].any()                   # moved by a rule, never by a gradient
            continue
        assert_grad(lambda: model.forward(x, None, y)[0], p.data, g[p.name], p.name, n=6)


def test_heads_assembly_backward():
    """The rotary key shared by every head collects their gradients; the pads collect none."""
    rng = np.random.default_rng(1)
    nh, dims, T = 3, (5, 4, 7), 6
    q, kv, kr = (rng.standard_normal((2, T, n)) for n in (nh * 9, nh * 12, 4))
    cos, sin = rope_tables(np.arange(T), 4, 100.0, np.float64, np)
    R = [rng.standard_normal((2, nh, T, 9)) for _ in range(3)]

    def loss():
        return sum(np.sum(r * a) for r, a in zip(R, mla_heads_forward(q, kv, kr, nh, dims, cos, sin, True, 1.3)[:3]))
    cache = mla_heads_forward(q, kv, kr, nh, dims, cos, sin, True, 1.3)[3]
    dq, dkv, dkr = mla_heads_backward(*R, cache)
    for what, x, g in (("q", q, dq), ("kv", kv, dkv), ("k_rope", kr, dkr)):
        assert_grad(loss, x, g, what)
    x = rng.standard_normal((3, 8))
    np.testing.assert_array_equal(interleave(deinterleave(x)), x)
    np.testing.assert_array_equal(deinterleave(x)[:, :4], x[:, 0::2])


@pytest.mark.parametrize("cfg", list(CASES.values()), ids=list(CASES))
def test_split_backward_and_recomputation_give_the_same_gradients(cfg):
    model = model_of(cfg, seed=1)
    x, y = batch(cfg)
    _, plain = grads(model, x, y)
    work = []
    grads(model, x, y, defer=work)
    for fn in work:
        fn()
    split = {p.name: p.grad.copy() for p in model.parameters()}
    for full, attention in ((True, False), (False, True)):
        model.set_recompute(full, attention)
        _, again = grads(model, x, y)
        for name, g in plain.items():
            np.testing.assert_array_equal(again[name], g)
            np.testing.assert_array_equal(split[name], g)


@pytest.mark.parametrize("cfg", list(CASES.values()), ids=list(CASES))
def test_generation_from_the_latent_gives_the_training_logits(cfg):
    """Prefill of 5 tokens, then one at a time through the cached latent (W_uk folded into the queries, W_uv
    after the weighted sum): the logits of a whole-sequence forward."""
    from hpcpar.training.generate import forward_cached, new_cache
    model = model_of(cfg)
    ids = batch(cfg, B=2)[0]
    h, _ = model.embed.forward(ids)
    for b in model.blocks:
        h = b.forward(h)[0]
    want = model.head.forward_cached(h)
    kv = new_cache(model, 2, cfg.seq_len)
    got = [forward_cached(model, ids[:, :5], kv, 0)]
    got += [forward_cached(model, ids[:, t:t + 1], kv, t) for t in range(5, cfg.seq_len)]
    np.testing.assert_allclose(np.concatenate(got, axis=1), want, rtol=1e-10, atol=1e-12)
    assert kv[0][0].shape == (2, cfg.seq_len, cfg.kv_lora_rank) and kv[0][1].shape == (2, cfg.seq_len, 4)


def test_group_limited_routing_and_scaling():
    """8 experts in 4 groups of 2, each token's 2 from its 2 best groups (a group's score: its two best s + b);
    the weights renormalised and times 2.5, and their backward against finite differences."""
    rng = np.random.default_rng(2)
    logits, bias = rng.standard_normal((20, 8)), 0.1 * rng.standard_normal(8)
    idx, w, cache = router_forward(logits, 2, "sigmoid", bias, True, (4, 2), 2.5)
    s = 1 / (1 + np.exp(-logits)) + bias
    for t in range(20):
        group = s[t].reshape(4, 2).sum(axis=1)
        allowed = np.argsort(-group)[:2]
        choice = np.where(np.repeat(np.isin(np.arange(4), allowed), 2), s[t], -np.inf)
        np.testing.assert_array_equal(idx[t], np.argsort(-choice)[:2])
    np.testing.assert_allclose(w.sum(axis=1), 2.5, rtol=1e-13)
    R = rng.standard_normal(w.shape)
    assert_grad(lambda: np.sum(R * router_forward(logits, 2, "sigmoid", bias, True, (4, 2), 2.5)[1]), logits,
                router_backward(R, cache), "grouped router")


def test_the_first_layers_are_dense_and_the_count_is_the_arrays():
    model = GPT(replace(CFG, n_layer=3, mtp_depth=0), dtype="float64")
    kinds = [type(b.mlp).__name__ for b in model.blocks]
    assert kinds == ["SwiGLU", "MoE", "MoE"]
    assert model.blocks[0].mlp.gate_up.parts[0].weight.data.shape == (16, 20)       # the dense width
    assert CFG.routing_bias and model.blocks[1].mlp.bias is not None               # DeepSeek's files hold it
    assert sum(p.data.size for p in model.parameters()) == replace(CFG, n_layer=3).n_params()


@pytest.mark.parametrize("change, message", [
    (dict(arch="llama", n_kv_head=2, head_dim=0, qk_rope_dim=0, v_head_dim=0, q_lora_rank=0, kv_lora_rank=8),
     "latent attention's sizes .* need a DeepSeek model"),
    (dict(kv_lora_rank=0), "needs kv_lora_rank, qk_rope_dim and head_dim"),
    (dict(qk_rope_dim=3), "qk_rope_dim 3 must be even"),
    (dict(n_group=3), "3 groups of the 4 experts"),
    (dict(n_group=4), "4 groups of the 4 experts, two or more each"),
])
def test_impossible_sizes_are_refused(change, message):
    with pytest.raises(UsageError, match=message):
        GPTConfig(**{**CFG.__dict__, **change})


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_follows_float32(precision):
    """The latent norms in fp32, the GEMMs and the core in the low precision, fp32 master weights: three
    steps of deepseek-tiny with MTP within the low precision's round-off of float32's."""
    from mpi4py import MPI
    from train_helpers import free, trainer
    dims = dict(model="deepseek-tiny", layers=2, hidden=32, heads=4, ffn=16, seq_len=8, synthetic_vocab=29,
                batch_size=8, mtp=1)
    runs = [trainer(MPI.COMM_SELF, dims=dims, dtype="float32", precision=p) for p in ("fp32", precision)]
    want, got = ([t.step(s).loss for s in range(3)] for t in runs)
    assert np.isfinite(got).all() and np.allclose(got, want, rtol=2e-2)
    for t in runs:
        free(t)


def test_dims_text_round_trips_and_refuses_what_it_cannot_read():
    from hpcpar.nn.dims import dims_text, parse_dims
    values = dict(q_lora_rank=0, kv_lora_rank=8, rope_interleave=False, routed_scale=2.5, yarn=WIDE_V.yarn)
    assert parse_dims(dims_text(values)) == values
    for text, message in (("first_dense=x", "first_dense=x must be an integer"), ("q_lra=1", "'q_lra=1' is not one"),
                          ("yarn_factor=4", "YaRN needs yarn_factor and yarn_original_positions"),
                          ("rope_interleave=maybe", "must be true or false")):
        with pytest.raises(UsageError, match=message):
            parse_dims(text)
