"""The mixture of experts: the router's, the permutation's, the grouped GEMM's and the whole block's
backward against central finite differences in float64 (router gradient and load-balancing loss
included); the permutation and the capacity against their definitions; the balancing bias's rule."""
from dataclasses import replace

import numpy as np
import pytest

from gradcheck import assert_grad
from hpcpar.nn.gpt import GPT, preset
from hpcpar.nn.module import Context
from hpcpar.nn.moe import MoE, capacity
from hpcpar.ops.moe import (combine_backward, combine_forward, dispatch_backward, dispatch_forward,
                            grouped_backward_input, grouped_backward_weight, grouped_forward, route_order, slots)
from hpcpar.ops.router import (balance_bias_update, expert_counts, load_balance_backward, load_balance_forward,
                               router_backward, router_forward)


@pytest.fixture
def rng():
    return np.random.default_rng(11)


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("normalise", [True, False])
def test_router_gradient(rng, score, normalise):
    logits = rng.standard_normal((9, 6))
    bias = 0.1 * rng.standard_normal(6)
    R, D = rng.standard_normal((9, 2)), 0.7
    idx, w, cache = router_forward(logits, 2, score, bias, normalise)

    def loss():
        i, w_, c = router_forward(logits, 2, score, bias, normalise)
        assert (i == idx).all()                             # the choice must not move under the steps
        return np.sum(R * w_) + D * load_balance_forward(c, expert_counts(i, 6))[0]
    aux, f = load_balance_forward(cache, expert_counts(idx, 6))
    assert_grad(loss, logits, router_backward(R, cache, load_balance_backward(D, cache, f)), "dlogits")


def test_router_choice_and_weights(rng):
    logits = rng.standard_normal((5, 4))
    s = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    idx, w, _ = router_forward(logits, 2)
    np.testing.assert_array_equal(idx, np.argsort(-s, axis=1)[:, :2])        # best first
    top = np.take_along_axis(s, idx, 1)
    np.testing.assert_allclose(w, top / top.sum(1, keepdims=True), rtol=1e-14)
    bias = np.array([0.0, 0.0, 0.0, 10.0])                  # the bias moves the choice, not the weights
    idx_b, w_b, _ = router_forward(logits, 1, bias=bias, normalise=False)
    assert (idx_b[:, 0] == 3).all()
    np.testing.assert_allclose(w_b[:, 0], s[:, 3], rtol=1e-14)


def test_load_balance_loss_is_k_when_even():
    # every expert gets as many choices and the same mean probability: aux = E sum_e (k/E)(1/E) = k
    logits = np.zeros((8, 4))
    idx = np.array([[0, 1], [2, 3]] * 4)
    aux, _ = load_balance_forward(router_forward(logits, 2)[2], expert_counts(idx, 4))
    assert aux == pytest.approx(2.0, rel=1e-14)


def test_route_order_makes_experts_contiguous(rng):
    idx = rng.integers(0, 5, (12, 3))
    order, offsets, dropped = route_order(idx, 5)
    flat = idx.reshape(-1)
    assert len(order) == flat.size and dropped.sum() == 0
    for e in range(5):
        rows = order[offsets[e]:offsets[e + 1]]
        assert (flat[rows] == e).all() and (np.diff(rows) > 0).all()     # token order within an expert


def test_capacity_drops_the_latest_tokens_and_counts_them():
    idx = np.array([[0], [0], [0], [1], [0]])               # expert 0 chosen 4 times, capacity 2
    order, offsets, dropped = route_order(idx, 2, capacity=2)
    np.testing.assert_array_equal(order, [0, 1, 3])
    assert offsets == [0, 2, 3] and list(dropped) == [2, 0]
    assert capacity(1.0, 5, 1, 2) == 3 and capacity(0.0, 5, 1, 2) is None


@pytest.mark.parametrize("N, k, E, cap", [(9, 3, 4, 5), (6, 1, 3, 1), (0, 2, 3, None)])
def test_combine_and_dispatch_backward_sum_each_tokens_kept_rows(rng, N, k, E, cap):
    """The gathers against the plain definition, token by token: choices dropped (k 3, and k 1 where a
    dropped token gets nothing at all), and a rank with no tokens."""
    C = 5
    idx = np.array([rng.permutation(E)[:k] for _ in range(N)], dtype=np.int64).reshape(N, k)
    order, _, dropped = route_order(idx, E, capacity=cap)
    assert (dropped.sum() > 0) == (cap is not None)
    slot = slots(order, N, k)
    ye, w = rng.standard_normal((len(order), C)), rng.standard_normal((N, k))
    y, dx = np.zeros((N, C)), np.zeros((N, C))
    for row, a in enumerate(order):
        y[a // k] += w[a // k, a % k] * ye[row]
        dx[a // k] += ye[row]
        assert slot[a // k, a % k] == row
    assert (slot == -1).sum() == dropped.sum()
    np.testing.assert_allclose(combine_forward(ye, w, slot), y, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dispatch_backward(ye, slot), dx, rtol=0, atol=1e-12)


def test_dispatch_grouped_combine_gradients(rng):
    N, k, E, C, F = 7, 2, 3, 4, 5
    idx = np.stack([rng.permutation(E)[:k] for _ in range(N)])
    order, offsets, _ = route_order(idx, E, capacity=4)   # some choices dropped
    x, w = rng.standard_normal((N, C)), rng.standard_normal((N, k))
    W, b = rng.standard_normal((E, C, F)), rng.standard_normal((E, F))
    V = rng.standard_normal((E, F, C))
    R = rng.standard_normal((N, C))

    def forward():
        h = grouped_forward(dispatch_forward(x, order, k), W, offsets, b)
        return combine_forward(grouped_forward(np.tanh(h), V, offsets), w, slots(order, N, k))
    loss = lambda: np.sum(R * forward())  # noqa: E731
    xs = dispatch_forward(x, order, k)
    h = grouped_forward(xs, W, offsets, b)
    ye = grouped_forward(np.tanh(h), V, offsets)
    dye, dw = combine_backward(R, ye, w, order)
    dV, dW, db = np.zeros_like(V), np.zeros_like(W), np.zeros_like(b)
    grouped_backward_weight(dye, np.tanh(h), offsets, dV)
    dh = grouped_backward_input(dye, V, offsets) * (1 - np.tanh(h) ** 2)
    grouped_backward_weight(dh, xs, offsets, dW, db)
    dx = dispatch_backward(grouped_backward_input(dh, W, offsets), slots(order, N, k))
    for what, p, g in (("dx", x, dx), ("dw", w, dw), ("dW", W, dW), ("db", b, db), ("dV", V, dV)):
        assert_grad(loss, p, g, what)


def _moe_cfg(arch, **kw):
    name = "mixtral-tiny" if arch == "llama" else "moe-tiny"
    return replace(preset(name, vocab_size=16), d_model=12, n_head=2, n_kv_head=2 if arch == "llama" else 0,
                   d_ff=10, n_expert=5, **{"top_k": 2, **kw})


CASES = {"plain": {}, "shared": dict(n_shared_expert=2), "aux": dict(aux_loss_coef=0.3),
         "sigmoid": dict(router_score="sigmoid", bias_rate=0.01, aux_loss_coef=0.2),
         "unnormalised": dict(norm_topk=False, top_k=3), "capacity": dict(capacity_factor=0.8, aux_loss_coef=0.1)}


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("case", list(CASES))
def test_moe_block_gradient(rng, arch, case):
    """The whole block, router and auxiliary loss included: loss = sum(R y) + loss_scale aux_sum."""
    cfg = _moe_cfg(arch, **CASES[case])
    moe = MoE("h.0.mlp", cfg, 3, np.float64, std=0.5)       # a large router: decided, varied choices
    if moe.bias is not None:
        moe.bias.data[:] = 0.05 * rng.standard_normal(cfg.n_expert)
    x, R = rng.standard_normal((2, 6, 12)), rng.standard_normal((2, 6, 12))
    ctx = Context(loss_scale=0.37)

    def loss():
        y, cache = moe.forward(x, ctx)
        c_route = cache[3]
        aux = load_balance_forward(c_route, expert_counts(c_route[2], cfg.n_expert))[0]
        return np.sum(R * y) + 0.37 * cfg.aux_loss_coef * 12 * aux
    y, cache = moe.forward(x, ctx)
    moe.zero_grad()
    dx = moe.backward(R, cache)
    assert_grad(loss, x, dx, f"{case} dx")
    for p in moe.parameters():
        if p is not moe.bias:
            assert_grad(loss, p.data, p.grad, f"{case} {p.name}")
    if case == "capacity":
        assert moe.stats.dropped > 0
    assert moe.stats.counts.sum() == 12 * cfg.top_k


def test_balance_bias_update_moves_choice_off_the_busy_expert():
    bias = np.zeros(3)
    balance_bias_update(bias, np.array([10, 1, 1]), 0.1)
    np.testing.assert_allclose(bias, [-0.1, 0.1, 0.1])


@pytest.mark.parametrize("name", ["moe-tiny", "mixtral-tiny", "qwen3-moe-tiny"])
def test_model_parameter_count(name):
    for kw in ({}, dict(n_shared_expert=2, bias_rate=0.1)):
        cfg = preset(name, vocab_size=40, **kw)
        assert sum(p.data.size for p in GPT(cfg).parameters()) == cfg.n_params()
