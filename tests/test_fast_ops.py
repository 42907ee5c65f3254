"""Each tuned op against the plain twin it sits beside, in float64; the blocked SGD update against the
textbook lines, the blocked AdamW against its update on whole arrays.

The two compute the same function in another order (a BLAS row sum instead of numpy's, ...), so
they agree to rounding, not bit for bit: 1e-12 relative.  Where the order does not change the
arithmetic (a maximum is exact in any order) the test says so and asks for equality.
"""
import numpy as np
import pytest

from hpcpar.data_parallel.flat import FlatSlice
from hpcpar.ops.activation import gelu_backward, gelu_backward_fast, gelu_forward, gelu_forward_fast
from hpcpar.ops.attention import (QUERY_BLOCK, attention_backward, attention_backward_plain, attention_forward,
                                  attention_forward_plain, causal_mask, causal_work, engine_block, query_blocks)
from hpcpar.ops.dropout import dropout_mask
from hpcpar.ops.layernorm import (layernorm_backward, layernorm_backward_plain, layernorm_forward,
                                  layernorm_forward_plain)
from hpcpar.ops.masks import Mask
from hpcpar.ops.swiglu import swiglu_backward, swiglu_backward_plain, swiglu_forward, swiglu_forward_plain
from hpcpar.ops.softmax import row_max, softmax_forward, softmax_forward_fast
from hpcpar.optim import BLOCK, SGD, AdamW, adamw_plain, adamw_update, sgd_plain


@pytest.fixture
def rng():
    return np.random.default_rng(21)


@pytest.mark.parametrize("n", [1, 7, 96, 128, 160])
def test_row_max_is_the_maximum_exactly(rng, n):
    x = rng.standard_normal((37, n))
    np.testing.assert_array_equal(row_max(x), x.max(axis=-1, keepdims=True))


@pytest.mark.parametrize("shape", [(3, 5, 128, 128), (2, 4, 96, 96), (6, 7), (4, 1)])
def test_fast_softmax_matches_the_plain_one(rng, shape):
    x = rng.standard_normal(shape) * 6
    if shape[-1] == shape[-2]:
        x += causal_mask(shape[-1], x.dtype, np)               # attention's masked scores: -inf above
    plain = softmax_forward(x)
    np.testing.assert_allclose(softmax_forward_fast(x), plain, rtol=1e-12, atol=1e-300)
    inplace = x.copy()
    assert softmax_forward_fast(inplace, out=inplace) is inplace
    np.testing.assert_allclose(inplace, plain, rtol=1e-12, atol=1e-300)


def test_fast_softmax_is_stable():
    np.testing.assert_allclose(softmax_forward_fast(np.array([[1000.0, 1000.0], [-1000.0, 0.0]])),
                               [[0.5, 0.5], [0.0, 1.0]])


@pytest.mark.parametrize("shape", [(3, 5, 96), (2, 4096), (7,)])
def test_fast_gelu_matches_the_plain_one(rng, shape):
    """Same y; the cached derivative c (0.5 + x (2 - c) ...) times dy against 0.5 (1 + t + x (1 - t^2) ...)
    dy: the plain form cancels in 1 - t^2 where tanh is near +-1 (|x| > 4), so the bound is relative to
    the largest dx.  Written over its input, the forward gives the same numbers."""
    x, dy = rng.standard_normal(shape) * 3, rng.standard_normal(shape)
    y, t = gelu_forward(x)
    y_fast, g = gelu_forward_fast(x)
    np.testing.assert_allclose(y_fast, y, rtol=1e-12, atol=1e-300)
    dx = gelu_backward(dy, x, t)
    np.testing.assert_allclose(gelu_backward_fast(dy, g), dx, rtol=1e-12, atol=1e-12 * np.abs(dx).max())
    over = x.copy()
    y_over, g_over = gelu_forward_fast(over, out=over)
    assert y_over is over
    np.testing.assert_array_equal(y_over, y_fast)
    np.testing.assert_array_equal(g_over, g)
    assert gelu_backward_fast(dy, g, out=dy) is dy


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_blocked_sgd_is_the_textbook_update(rng, momentum):
    """SGD.step runs its passes block by block; each number sees the same operations in the same
    order as the whole-array lines below, and element-wise IEEE arithmetic does not depend on the
    loop order, so the results are equal bit for bit (the same computation, on the same machine)."""
    n = 3 * BLOCK + 123                                         # blocks, and a short last one
    data = rng.standard_normal(n).astype(np.float32)
    ref, buf = data.copy(), None
    opt = SGD(0.1, momentum, weight_decay=0.2)
    for step in range(3):
        grad = rng.standard_normal(n).astype(np.float32)
        opt.step([FlatSlice("w", data, grad, [(0, n // 2)])], 0.05)
        ref[:n // 2] *= 1.0 - 0.05 * 0.2
        if momentum:
            buf = grad.copy() if buf is None else buf * np.float32(momentum) + grad
        ref -= 0.05 * (buf if momentum else grad)
        np.testing.assert_array_equal(data, ref)


def test_blocked_adamw_is_the_whole_array_update(rng):
    """AdamW.step runs adamw_update block by block: element-wise, so the same bits as one call on the
    whole arrays (weight decay on the first half only, as for a bias-free group; a short last block).
    The update itself is held to torch.optim.AdamW in tests/test_optim.py."""
    n = 3 * BLOCK + 123
    data = rng.standard_normal(n).astype(np.float32)
    ref, m, v, tmp = data.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32), np.empty(n, np.float32)
    opt = AdamW(0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for t in range(1, 4):
        grad = rng.standard_normal(n).astype(np.float32)
        opt.step([FlatSlice("w", data, grad, [(0, n // 2)])], 0.05)
        ref[:n // 2] *= 1.0 - 0.05 * 0.1
        adamw_update(ref, grad, m, v, tmp, 0.05, 0.9, 0.95, 1e-8, 1 - 0.9 ** t, 1 - 0.95 ** t)
        np.testing.assert_array_equal(data, ref)


@pytest.mark.parametrize("T, block", [(7, 1), (7, 3), (128, 64), (130, 64), (5, 64)])
@pytest.mark.parametrize("dropout", [False, True])
def test_causal_blocks_match_the_full_attention(rng, T, block, dropout):
    """Attention in query blocks (the upper triangle skipped) against the one-block plain form: the same
    products summed in another order (dK and dV over the blocks), so to rounding.  The backward writes
    into strided views of one fused array, as the attention module passes them."""
    B, NH, HS = 2, 3, 4
    q, k, v, do = (rng.standard_normal((B, NH, T, HS)) for _ in range(4))
    drop = dropout_mask((3, 1), (B, NH, T, T), 0.25, np.float64) if dropout else None
    o, cache = attention_forward(q, k, v, drop, block=T)
    plain = attention_backward(do, cache)
    o_blocks, cache = attention_forward(q, k, v, drop, block=block)
    fused = np.empty((B, NH, T, 3 * HS))
    views = tuple(fused[..., i * HS:(i + 1) * HS] for i in range(3))
    blocked = attention_backward(do, cache, out=views)
    np.testing.assert_allclose(o_blocks, o, rtol=1e-12, atol=1e-12 * np.abs(o).max())
    for got, want, view in zip(blocked, plain, views):
        assert got is view
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def test_causal_blocks_in_bf16_round_dk_dv_once():
    """In a low precision dK and dV are summed over the blocks in fp32 and rounded once: as close to the
    one-block attention as the one rounding allows."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal((2, 2, 9, 8)).astype(ml_dtypes.bfloat16) for _ in range(4))
    plain = attention_backward(do, attention_forward(q, k, v, block=9)[1])
    blocked = attention_backward(do, attention_forward(q, k, v, block=2)[1])
    for got, want in zip(blocked, plain):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2 ** -7, atol=1e-2)


def test_query_blocks_and_their_share_of_the_scores():
    assert query_blocks(7, 3) == [(0, 3), (3, 6), (6, 7)]
    assert query_blocks(4, 64) == [(0, 4)]
    assert causal_work(128, 64) == 0.75                       # (64 * 64 + 64 * 128) / 128^2
    assert causal_work(128, 128) == 1.0
    assert causal_work(1024) == pytest.approx(17 / 32)        # n blocks: (n + 1) / (2 n), n = 16
    assert engine_block(np.zeros((1, 1, 256, 8))) == QUERY_BLOCK
    on_gpu = type("OnDevice", (), {"shape": (1, 1, 256, 8), "__cuda_array_interface__": {}})()
    assert engine_block(on_gpu) == 256                        # one block: a launch per op is what costs there


def assert_twins(got, want):
    """The tuned op's outputs against its plain twin's, float64, to 1e-12 of each output's largest number."""
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.abs(b).max())


@pytest.mark.parametrize("shape", [(2, 700, 256), (3, 5, 48), (1, 7)])
def test_layernorm_is_its_plain_twin(rng, shape):
    """Row means as BLAS matrix-vector products, the backward's three sums in one pass over blocks of rows
    (2 x 700 rows of 256: several blocks and a short last one) against the textbook lines."""
    x, dy = rng.standard_normal(shape) * 3 + 1, rng.standard_normal(shape)
    g, b = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])
    y, cache = layernorm_forward(x, g, b)
    y_plain, cache_plain = layernorm_forward_plain(x, g, b)
    assert_twins((y, *cache), (y_plain, *cache_plain))
    assert_twins(layernorm_backward(dy, g, cache), layernorm_backward_plain(dy, g, cache_plain))


def test_swiglu_is_its_plain_twin(rng):
    """Block by block, into the strided halves of one (N, 2F) gradient as a gated MoE passes them."""
    a, u, dh = (rng.standard_normal((900, 160)) * 4 for _ in range(3))
    h, s = swiglu_forward(a, u)
    assert_twins((h, s), swiglu_forward_plain(a, u))
    both = np.empty((900, 320))
    got = swiglu_backward(dh, a, u, s, out=(both[:, :160], both[:, 160:]))
    assert_twins(got, swiglu_backward_plain(dh, a, u, s))


@pytest.mark.parametrize("mask", ["causal", "documents", "window"])
def test_attention_is_its_plain_twin(rng, mask):
    """The query blocks (skipping keys above the diagonal, in other documents, behind the window) and the
    fast softmax against the textbook lines on whole T x T matrices, with dropout."""
    B, NH, T, HS = 2, 3, 13, 4
    q, k, v, do = (rng.standard_normal((B, NH, T, HS)) for _ in range(4))
    drop = dropout_mask((5, 1), (B, NH, T, T), 0.25, np.float64)
    docs = np.array([[0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2], [0] * 6 + [1] * 7])
    attn_mask = {"causal": None, "documents": Mask(docs), "window": Mask(window=4)}[mask]
    o, cache = attention_forward(q, k, v, drop, block=4, attn_mask=attn_mask)
    o_plain, cache_plain = attention_forward_plain(q, k, v, drop, attn_mask)
    assert_twins((o,), (o_plain,))
    assert_twins(attention_backward(do, cache), attention_backward_plain(do, cache_plain))


@pytest.mark.parametrize("name", ["sgd", "sgd-momentum", "adamw"])
def test_optimizer_steps_are_their_plain_twins(rng, name):
    """SGD.step and AdamW.step (in blocks, in place, a scratch block) against sgd_plain and adamw_plain (the
    textbook lines on whole arrays), three steps with weight decay on part of the slice, float64."""
    n = 2 * BLOCK + 77
    data = rng.standard_normal(n)
    mask = np.zeros(n)
    mask[:n // 3] = 1.0
    opt = AdamW(0.01, (0.9, 0.95), 1e-8, 0.1) if name == "adamw" else \
        SGD(0.01, 0.9 if name == "sgd-momentum" else 0.0, weight_decay=0.1)
    p, u, m, v = data.copy(), None, np.zeros(n), np.zeros(n)
    for t in range(1, 4):
        grad = rng.standard_normal(n)
        opt.step([FlatSlice("w", data, grad, [(0, n // 3)])], 0.05)
        if name == "adamw":
            p, m, v = adamw_plain(p, grad, m, v, 0.05, 0.9, 0.95, 1e-8, t, (mask, 0.05 * 0.1))
        else:
            p, u = sgd_plain(p, grad, u, 0.05, opt.momentum, (mask, 0.05 * 0.1))
        assert_twins((data,), (p,))
