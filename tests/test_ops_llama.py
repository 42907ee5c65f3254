"""The Llama ops' backward against central finite differences, in float64 (relative error <= 1e-6),
contracted with a fixed random R as in test_ops.py; and their forward against the definitions."""
import numpy as np
import pytest

from gradcheck import assert_grad
from hpcpar.ops.gqa import repeat_kv_backward, repeat_kv_forward
from hpcpar.ops.qk_norm import qk_norm_backward_input, qk_norm_backward_weight, qk_norm_forward
from hpcpar.ops.rmsnorm import rmsnorm_backward_input, rmsnorm_backward_weight, rmsnorm_forward
from hpcpar.ops.rope import rope_backward, rope_forward, rope_tables, rotate_half
from hpcpar.ops.swiglu import swiglu_backward, swiglu_forward


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_rmsnorm(rng):
    x, g = rng.standard_normal((3, 4, 10)), rng.standard_normal(10)
    R = rng.standard_normal((3, 4, 10))
    loss = lambda: np.sum(R * rmsnorm_forward(x, g)[0])  # noqa: E731
    y, cache = rmsnorm_forward(x, g)
    np.testing.assert_allclose(y, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g, rtol=1e-13)
    assert_grad(loss, x, rmsnorm_backward_input(R, g, cache), "rmsnorm dx")
    assert_grad(loss, g, rmsnorm_backward_weight(R, cache), "rmsnorm dg")


def test_qk_norm(rng):
    """Per head: every (b, head, t) row of HS features has its own rms; the gains are shared by the heads,
    so their gradients sum over them (4 query heads, 2 K/V heads)."""
    q, k = rng.standard_normal((2, 4, 3, 6)), rng.standard_normal((2, 2, 3, 6)) * 5
    g_q, g_k = rng.standard_normal(6), rng.standard_normal(6)
    Rq, Rk = rng.standard_normal(q.shape), rng.standard_normal(k.shape)

    def loss():
        qn, kn, _ = qk_norm_forward(q, k, g_q, g_k, 1e-5)
        return np.sum(Rq * qn) + np.sum(Rk * kn)
    qn, kn, cache = qk_norm_forward(q, k, g_q, g_k, 1e-5)
    np.testing.assert_allclose(kn, k / np.sqrt((k * k).mean(-1, keepdims=True) + 1e-5) * g_k, rtol=1e-13)
    np.testing.assert_allclose(qn[1, 2, 0], q[1, 2, 0] / np.sqrt(np.mean(q[1, 2, 0] ** 2) + 1e-5) * g_q, rtol=1e-13)
    dq, dk = qk_norm_backward_input(Rq, Rk, g_q, g_k, cache)
    dg_q, dg_k = qk_norm_backward_weight(Rq, Rk, cache)
    for what, x, g in (("dq", q, dq), ("dk", k, dk), ("dg_q", g_q, dg_q), ("dg_k", g_k, dg_k)):
        assert_grad(loss, x, g, f"qk-norm {what}")
    # the heads are independent: a tensor-parallel rank's heads give its share of the gains' gradient
    half = qk_norm_backward_weight(Rq[:, :2], Rk[:, :1], qk_norm_forward(q[:, :2], k[:, :1], g_q, g_k, 1e-5)[2])
    rest = qk_norm_backward_weight(Rq[:, 2:], Rk[:, 1:], qk_norm_forward(q[:, 2:], k[:, 1:], g_q, g_k, 1e-5)[2])
    np.testing.assert_allclose(half[0] + rest[0], dg_q, rtol=1e-12)
    np.testing.assert_allclose(half[1] + rest[1], dg_k, rtol=1e-12)


def test_rope_tables_and_rotation(rng):
    cos, sin = rope_tables(np.array([0, 3]), 4, 100.0, np.float64, np)
    # position 3: angles 3 * 100^0 and 3 * 100^(-1/2), each twice (rotate-half layout)
    np.testing.assert_allclose(cos[1], np.cos([3.0, 0.3, 3.0, 0.3]), rtol=1e-15)
    np.testing.assert_allclose(cos[0], 1.0)
    np.testing.assert_array_equal(rotate_half(np.array([1.0, 2.0, 3.0, 4.0])), [-3.0, -4.0, 1.0, 2.0])
    x = rng.standard_normal((1, 2, 2, 4))
    y = rope_forward(x, cos, sin)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-14)  # a rotation


def test_rope_sees_relative_positions_only(rng):
    q, k = rng.standard_normal((1, 1, 1, 8)), rng.standard_normal((1, 1, 1, 8))

    def score(s, t):
        cs, ss = rope_tables(np.array([s]), 8, 10000.0, np.float64, np)
        ct, st = rope_tables(np.array([t]), 8, 10000.0, np.float64, np)
        return float(np.sum(rope_forward(q, cs, ss) * rope_forward(k, ct, st)))
    # (5, 2) and (105, 102): the same distance; float64 angles of ~100 rad keep ~1e-14 of their value
    assert score(5, 2) == pytest.approx(score(105, 102), rel=1e-11)


def test_rope_backward_with_scattered_positions(rng):
    positions = np.array([9, 2, 30, 31, 4])              # not contiguous: any global positions
    cos, sin = rope_tables(positions, 6, 10000.0, np.float64, np)
    x, R = rng.standard_normal((2, 3, 5, 6)), rng.standard_normal((2, 3, 5, 6))
    assert_grad(lambda: np.sum(R * rope_forward(x, cos, sin)), x, rope_backward(R, cos, sin), "rope dx")
    whole = rope_tables(np.arange(32), 6, 10000.0, np.float64, np)[0]
    np.testing.assert_array_equal(cos, whole[positions])    # a row depends on its position alone


def test_swiglu(rng):
    a, u = rng.standard_normal((4, 9)) * 3, rng.standard_normal((4, 9))
    R = rng.standard_normal((4, 9))
    h, cache = swiglu_forward(a, u)
    np.testing.assert_allclose(h, a / (1 + np.exp(-a)) * u, rtol=1e-13)
    da, du = swiglu_backward(R, a, u, cache)
    assert_grad(lambda: np.sum(R * swiglu_forward(a, u)[0]), a, da, "swiglu d gate")
    assert_grad(lambda: np.sum(R * swiglu_forward(a, u)[0]), u, du, "swiglu d up")
    assert np.isfinite(swiglu_forward(np.array([-1e4, 1e4]), np.ones(2))[0]).all()


@pytest.mark.parametrize("n_rep", [1, 3])
def test_repeat_kv(rng, n_rep):
    x = rng.standard_normal((2, 2, 5, 4))                 # 2 K/V heads
    y = repeat_kv_forward(x, n_rep)                        # 2 * n_rep query heads
    np.testing.assert_array_equal(y[:, n_rep], x[:, 1])    # head h reads K/V head h // n_rep
    R = rng.standard_normal(y.shape)
    assert_grad(lambda: np.sum(R * repeat_kv_forward(x, n_rep)), x, repeat_kv_backward(R, n_rep), "repeat_kv")
