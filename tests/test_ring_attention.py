"""Ring attention's math on one process: the ring over cp blocks equals single-rank attention, forward
and backward, in float64 (ops/ring_attention.py; the MPI ring is tests/test_context_parallel_mpi.py)."""
import numpy as np
import pytest

from gradcheck import assert_grad
from hpcpar.ops.attention import attention_backward, attention_forward
from hpcpar.ops.ring_attention import (balanced_positions, block_forward, merge, ring_source, scale,
                                       simulate_ring, visible)

B, NH, HS = 2, 3, 4


@pytest.fixture
def rng():
    return np.random.default_rng(5)


def qkv(rng, T):
    return [rng.standard_normal((B, NH, T, HS)) for _ in range(3)]


def split(x, positions):
    """The parts of a (B, NH, T, HS) array each cp rank holds."""
    return [np.ascontiguousarray(x[:, :, p]) for p in positions]


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_balanced_positions_cover_the_sequence_once_with_equal_causal_work(cp):
    T = 4 * cp
    positions = [balanced_positions(T, cp, r) for r in range(cp)]
    assert sorted(np.concatenate(positions).tolist()) == list(range(T))
    # causal work of a rank = number of (query, key) pairs with key <= query among its queries
    work = [int(sum(p + 1 for p in pos)) for pos in positions]
    assert len(set(work)) == 1, work
    assert balanced_positions(8, 2, 1).tolist() == [2, 3, 4, 5]


def test_ring_source_visits_every_block_once():
    for cp in (1, 2, 5):
        for r in range(cp):
            assert sorted(ring_source(r, s, cp) for s in range(cp)) == list(range(cp))
            assert ring_source(r, 0, cp) == r


def test_off_diagonal_blocks_are_half_squares():
    """With the causal balance, a block from another rank is either all queries x the early half of
    the keys, or the late half of the queries x all keys: half the (T/cp)^2 work, never a masked tile."""
    cp, T = 4, 32
    pos = [balanced_positions(T, cp, r) for r in range(cp)]
    for r in range(cp):
        for j in range(cp):
            rows, cols = visible(pos[r], pos[j])
            n = len(range(*rows.indices(T // cp))) * len(range(*cols.indices(T // cp)))
            assert n == (T // cp) ** 2 // (1 if r == j else 2)


def test_merging_two_key_sets_is_attention_over_both(rng):
    q, k, v = qkv(rng, 6)
    qp, kp = np.arange(6), np.arange(6)
    whole = block_forward(scale(q), k, v, qp, kp)
    a = block_forward(scale(q), k[:, :, :2], v[:, :, :2], qp, kp[:2])
    b = block_forward(scale(q), k[:, :, 2:], v[:, :, 2:], qp, kp[2:])
    o, lse = merge(*a, *b)
    np.testing.assert_allclose(o, whole[0], rtol=1e-13)      # float64, different summation order
    np.testing.assert_allclose(lse, whole[1], rtol=1e-13)
    np.testing.assert_allclose(o, attention_forward(q, k, v)[0], rtol=1e-12)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_ring_equals_single_rank_attention_forward_and_backward(rng, cp):
    T = 4 * cp
    q, k, v = qkv(rng, T)
    do = rng.standard_normal(q.shape)
    o_ref, cache = attention_forward(q, k, v)
    grads_ref = attention_backward(do, cache)
    pos = [balanced_positions(T, cp, r) for r in range(cp)]
    o, dq, dk, dv = simulate_ring(split(q, pos), split(k, pos), split(v, pos), pos, split(do, pos))
    # float64; the ring sums the softmax in another order than one rank does: equal to rounding
    for name, got, want in [("o", o, o_ref)] + list(zip(("dq", "dk", "dv"), (dq, dk, dv), grads_ref)):
        for r in range(cp):
            assert rel(got[r], want[:, :, pos[r]]) < 1e-12, (name, r)


def test_ring_backward_passes_the_finite_difference_check(rng):
    """The ring's own gradients against finite differences of the ring's own forward (cp 2)."""
    cp, T = 2, 8
    pos = [balanced_positions(T, cp, r) for r in range(cp)]
    q, k, v = (split(x, pos) for x in qkv(rng, T))
    R = [rng.standard_normal(x.shape) for x in q]
    loss = lambda: sum(np.sum(a * b) for a, b in zip(R, simulate_ring(q, k, v, pos)))  # noqa: E731
    _, dq, dk, dv = simulate_ring(q, k, v, pos, R)
    for r in range(cp):
        assert_grad(loss, q[r], dq[r], f"ring dq, rank {r}", n=8)
        assert_grad(loss, k[r], dk[r], f"ring dk, rank {r}", n=8)
        assert_grad(loss, v[r], dv[r], f"ring dv, rank {r}", n=8)
