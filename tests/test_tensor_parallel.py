"""Tensor parallelism on real ranks (tp = 2 and 4) against the single-rank engine, float64."""
import numpy as np
import pytest

from hpcpar.nn import GPT, Context, GPTConfig, MLPConfig, MLPModel
from hpcpar.nn.linear import Linear
from hpcpar.tensor_parallel import parallelize
from hpcpar.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from mpitools import assert_shard_and_whole
from tp_helpers import assert_close, full_grad, seq_context, tp_comm

CFG = GPTConfig(vocab_size=30, seq_len=8, n_layer=2, n_head=4, d_model=16)


def tp_sizes(world):
    return [t for t in (2, 4) if world.size % t == 0]


@pytest.mark.mpi(min_size=2)
def test_seed_worked_example_column_split(comm):
    """W = [[1,2,3,4],[5,6,7,8]], x = (1,1): rank 0 computes (6, 8), rank 1 (10, 12)."""
    tp = tp_comm(comm, 2)
    lin = Linear("w", 2, 4, 0.02, 0, np.float64, bias=False)
    lin.weight.data[...] = [[1, 2, 3, 4], [5, 6, 7, 8]]
    from hpcpar.nn.parameter import Parameter
    lin.bias = Parameter("w.bias", np.zeros(4))
    col = ColumnParallelLinear(lin, tp)
    y, _ = col.forward(np.array([[1.0, 1.0]]))
    np.testing.assert_array_equal(y, [[6, 8]] if tp.rank == 0 else [[10, 12]])
    np.testing.assert_array_equal(tp.all_gather(y, axis=1), [[6, 8, 10, 12]])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sp", [False, True])
def test_column_then_row_linear(comm, sp):
    for t in tp_sizes(comm):
        tp = tp_comm(comm, t)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 8, 6))
        a, b = Linear("a", 6, 12, 0.5, 1, np.float64), Linear("b", 12, 6, 0.5, 2, np.float64)
        y_ref = b.forward(a.forward(x)[0])[0]
        full_a, full_b = a.weight.data.copy(), b.weight.data.copy()
        col, row = ColumnParallelLinear(a, tp, sp), RowParallelLinear(b, tp, sp)
        assert_shard_and_whole(tp, col.weight.data, full_a, axis=1, what="column weight")
        assert_shard_and_whole(tp, row.weight.data, full_b, axis=0, what="row weight")
        k = 8 // t
        x_in = x[:, tp.rank * k:(tp.rank + 1) * k] if sp else x
        h, c1 = col.forward(x_in)
        y, c2 = row.forward(h)
        want = y_ref[:, tp.rank * k:(tp.rank + 1) * k] if sp else y_ref
        assert_close(y, want, "column->row output")
        tp.mpi.Free()


def compare_gpt(comm, t, cfg, sp, recompute=False):
    tp = tp_comm(comm, t)
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, cfg.vocab_size, size=(3, cfg.seq_len + 1))
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    ctx_kw = dict(step=3, seed=1, sample_ids=[0, 1, 2])
    ref = GPT(cfg, seed=2, dtype="float64")
    loss_ref, caches = ref.forward(ids, Context(**ctx_kw), targets)
    ref.backward(1.0 / targets.size, caches)
    model = parallelize(GPT(cfg, seed=2, dtype="float64"), tp, sp)
    model.set_recompute(recompute)
    loss, caches = model.forward(ids, seq_context(tp, cfg.seq_len, sp, **ctx_kw), targets)
    model.backward(1.0 / targets.size, caches)
    assert_close(loss, loss_ref, f"loss (tp={t}, sp={sp})")
    want = {p.name: p.grad for p in ref.parameters()}
    for p in model.parameters():
        g = full_grad(p, tp)
        if p.tp_partial:                       # sequence parallelism: partial sums over the TP group
            g = tp.all_reduce(g)
        assert_close(g, want[p.name], f"grad {p.name} (tp={t}, sp={sp})")
    tp.mpi.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("sp", [False, True])
def test_whole_gpt_matches_single_rank(comm, tied, sp):
    cfg = GPTConfig(**{**CFG.__dict__, "tied": tied})
    for t in tp_sizes(comm):
        compare_gpt(comm, t, cfg, sp)


@pytest.mark.mpi(min_size=2)
def test_gpt_with_dropout_recompute_and_padded_vocab(comm):
    """Vocabulary 31 does not divide by tp: padded, masked, still exact; dropout masks agree too."""
    cfg = GPTConfig(**{**CFG.__dict__, "vocab_size": 31, "dropout": 0.1})
    for t in tp_sizes(comm):
        compare_gpt(comm, t, cfg, sp=True, recompute=True)
        compare_gpt(comm, t, cfg, sp=False)


@pytest.mark.mpi(min_size=2)
def test_deep_mlp_model(comm):
    cfg = MLPConfig(d_in=6, d_model=8, d_ff=16, n_layer=3, d_out=5)
    for t in tp_sizes(comm):
        tp = tp_comm(comm, t)
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((4, 6)), rng.standard_normal((4, 5))
        ref = MLPModel(cfg, seed=1, dtype="float64")
        l_ref, c = ref.forward(x, None, y)
        ref.backward(1.0, c)
        model = parallelize(MLPModel(cfg, seed=1, dtype="float64"), tp)
        loss, c = model.forward(x, None, y)
        model.backward(1.0, c)
        assert_close(loss, l_ref, "mlp loss")
        want = {p.name: p.grad for p in ref.parameters()}
        for p in model.parameters():
            assert_close(full_grad(p, tp), want[p.name], f"mlp grad {p.name}")
        tp.mpi.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_two_all_reduces_forward_and_two_backward_per_block(comm, sp, arch):
    """Llama too: its separate q, k, v (and gate, up) projections cross the input region once."""
    t = 2
    tp = tp_comm(comm, t)
    L = 3
    llama = dict(arch="llama", n_kv_head=2, tied=False) if arch == "llama" else {}
    cfg = GPTConfig(**{**CFG.__dict__, "n_layer": L, **llama})
    stage = parallelize(GPT(cfg, seed=0, dtype="float64", first=False, last=False), tp, sp)
    T = cfg.seq_len // t if sp else cfg.seq_len
    x = np.random.default_rng(0).standard_normal((2, T, cfg.d_model))
    ctx = seq_context(tp, cfg.seq_len, sp)
    tp.stats.reset()
    y, caches = stage.forward(x, ctx)
    fwd = dict(tp.stats.calls)
    tp.stats.reset()
    stage.backward(np.ones_like(y), caches)
    bwd = dict(tp.stats.calls)
    b_s_h = 2 * cfg.seq_len * cfg.d_model * 8          # bytes of one (B, T, C) float64 activation
    if sp:
        assert fwd == {"all_gather": 2 * L, "reduce_scatter": 2 * L}
        # backward: the row-parallel all-gathers, plus the column-parallel inputs gathered again
        assert bwd == {"all_gather": 4 * L, "reduce_scatter": 2 * L}
    else:
        assert fwd == {"all_reduce": 2 * L} and bwd == {"all_reduce": 2 * L}
        assert tp.stats.bytes["all_reduce"] == 2 * L * b_s_h
    tp.mpi.Free()
