"""Every op's backward against central finite differences, in float64 (relative error <= 1e-6).

Each check contracts the op's output with a fixed random tensor R, so loss = sum(R * f(x)) and
dloss/dx is exactly the backward applied to R.
"""
import numpy as np
import pytest

from gradcheck import assert_grad
from hpcpar.ops.activation import gelu_backward, gelu_forward
from hpcpar.ops.attention import attention_backward, attention_forward, merge_heads, split_heads
from hpcpar.ops.cross_entropy import cross_entropy_backward, cross_entropy_forward
from hpcpar.ops.dropout import dropout_backward, dropout_forward, dropout_mask
from hpcpar.ops.embedding import embedding_backward_weight, embedding_forward
from hpcpar.ops.layernorm import layernorm_backward, layernorm_forward
from hpcpar.ops.linear import linear_backward_input, linear_backward_weight, linear_forward
from hpcpar.ops.residual import residual_backward, residual_forward
from hpcpar.ops.softmax import softmax_backward, softmax_forward


@pytest.fixture
def rng():
    return np.random.default_rng(42)


def test_linear(rng):
    x, w, b = rng.standard_normal((2, 5, 7)), rng.standard_normal((7, 3)), rng.standard_normal(3)
    R = rng.standard_normal((2, 5, 3))
    loss = lambda: np.sum(R * linear_forward(x, w, b))  # noqa: E731
    dw, db = linear_backward_weight(R, x)
    assert_grad(loss, x, linear_backward_input(R, w), "linear dx")
    assert_grad(loss, w, dw, "linear dW")
    assert_grad(loss, b, db, "linear db")


def test_linear_bias_gradient_is_the_row_sum(rng):
    """db = ones^T dy (a matrix-vector product) against the plain sum over the rows; none without a bias."""
    x, dy = rng.standard_normal((3, 700, 16)), rng.standard_normal((3, 700, 24))
    dw, db = linear_backward_weight(dy, x)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 1)), rtol=1e-12, atol=1e-12)
    dw_alone, none = linear_backward_weight(dy, x, bias=False)
    assert none is None
    np.testing.assert_array_equal(dw_alone, dw)


def test_gelu(rng):
    x = rng.standard_normal((4, 9)) * 3
    R = rng.standard_normal((4, 9))
    y, t = gelu_forward(x)
    assert_grad(lambda: np.sum(R * gelu_forward(x)[0]), x, gelu_backward(R, x, t), "gelu")
    # tanh form: gelu(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715))
    assert abs(gelu_forward(np.array([1.0]))[0][0] - 0.8411919906082768) < 1e-12


def test_layernorm(rng):
    x, g, b = rng.standard_normal((3, 4, 10)), rng.standard_normal(10), rng.standard_normal(10)
    R = rng.standard_normal((3, 4, 10))
    loss = lambda: np.sum(R * layernorm_forward(x, g, b)[0])  # noqa: E731
    _, cache = layernorm_forward(x, g, b)
    dx, dg, db = layernorm_backward(R, g, cache)
    assert_grad(loss, x, dx, "layernorm dx")
    assert_grad(loss, g, dg, "layernorm dg")
    assert_grad(loss, b, db, "layernorm db")


def test_layernorm_backward_in_blocks_is_the_plain_formula(rng):
    """Many blocks of rows (ops/blocks.py): dg and db summed block by block, dx block by block, against
    the textbook lines on the whole array."""
    x, g, b, dy = rng.standard_normal((2, 300, 256)), rng.standard_normal(256), rng.standard_normal(256), \
        rng.standard_normal((2, 300, 256))
    _, (xhat, rstd) = layernorm_forward(x, g, b)
    dx, dg, db = layernorm_backward(dy, g, (xhat, rstd))
    dxhat = dy * g
    plain = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    np.testing.assert_allclose(dx, plain, rtol=1e-12, atol=1e-12 * np.abs(plain).max())
    np.testing.assert_allclose(dg, (dy * xhat).sum((0, 1)), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, dy.sum((0, 1)), rtol=1e-12, atol=1e-12)


def test_softmax(rng):
    x = rng.standard_normal((5, 8)) * 4
    R = rng.standard_normal((5, 8))
    y = softmax_forward(x)
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-14)
    assert_grad(lambda: np.sum(R * softmax_forward(x)), x, softmax_backward(R.copy(), y), "softmax")
    big = softmax_forward(np.array([[1000.0, 1000.0]]))     # stable: no overflow
    np.testing.assert_allclose(big, [[0.5, 0.5]])


@pytest.mark.parametrize("dropout", [False, True])
def test_attention(rng, dropout):
    B, NH, T, HS = 2, 3, 5, 4
    q, k, v = (rng.standard_normal((B, NH, T, HS)) for _ in range(3))
    drop = dropout_mask((1, 2), (B, NH, T, T), 0.3, np.float64) if dropout else None
    R = rng.standard_normal((B, NH, T, HS))
    loss = lambda: np.sum(R * attention_forward(q, k, v, drop)[0])  # noqa: E731
    dq, dk, dv = attention_backward(R, attention_forward(q, k, v, drop)[1])
    assert_grad(loss, q, dq, "attention dq")
    assert_grad(loss, k, dk, "attention dk")
    assert_grad(loss, v, dv, "attention dv")


def test_attention_is_causal(rng):
    q, k, v = (rng.standard_normal((1, 2, 6, 4)) for _ in range(3))
    o = attention_forward(q, k, v)[0]
    v2 = v.copy()
    v2[:, :, 4:] += 10.0                     # change the future: positions 0..3 must not notice
    np.testing.assert_array_equal(attention_forward(q, k, v2)[0][:, :, :4], o[:, :, :4])


def test_split_merge_heads_round_trip(rng):
    x = rng.standard_normal((2, 5, 12))
    np.testing.assert_array_equal(merge_heads(split_heads(x, 3)), x)


def test_embedding(rng):
    w = rng.standard_normal((7, 4))
    ids = rng.integers(0, 7, size=(3, 5))           # with repeats: they must accumulate
    R = rng.standard_normal((3, 5, 4))
    loss = lambda: np.sum(R * embedding_forward(ids, w))  # noqa: E731
    assert_grad(loss, w, embedding_backward_weight(R, ids, 7), "embedding dW")


def test_cross_entropy(rng):
    z = rng.standard_normal((6, 9)) * 3
    t = rng.integers(0, 9, size=6)
    R = rng.standard_normal(6)
    loss = lambda: np.sum(R * cross_entropy_forward(z.copy(), t)[0])  # noqa: E731
    losses, cache = cross_entropy_forward(z.copy(), t)
    ref = -np.log(np.exp(z) / np.exp(z).sum(-1, keepdims=True))[np.arange(6), t]
    np.testing.assert_allclose(losses, ref, rtol=1e-12)
    assert_grad(loss, z, cross_entropy_backward(R, cache), "cross-entropy dz")
    huge = cross_entropy_forward(np.array([[1e4, 0.0]]), np.array([1]))[0]
    np.testing.assert_allclose(huge, [1e4])         # stable: logsumexp without overflow


def test_dropout_is_deterministic_and_unbiased(rng):
    m1 = dropout_mask((3, 1, 4), (1000, 100), 0.25, np.float64)
    m2 = dropout_mask((3, 1, 4), (1000, 100), 0.25, np.float64)
    np.testing.assert_array_equal(m1, m2)
    assert set(np.unique(m1)) == {0.0, 1 / 0.75}
    assert abs(m1.mean() - 1.0) < 0.01
    x, R = rng.standard_normal((1000, 100)), rng.standard_normal((1000, 100))
    assert_grad(lambda: np.sum(R * dropout_forward(x, m1)), x, dropout_backward(R, m1), "dropout")


def test_residual(rng):
    x, f = rng.standard_normal(5), rng.standard_normal(5)
    np.testing.assert_array_equal(residual_forward(x, f), x + f)
    np.testing.assert_array_equal(residual_backward(x, f), x + f)
