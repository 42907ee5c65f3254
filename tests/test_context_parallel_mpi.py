"""Context parallelism on real ranks: every layout with cp trains the same model to the same numbers as
one rank (float64: losses of 3 AdamW steps, and every gradient of the first step)."""
import numpy as np
import pytest

from hpcpar.backend import to_numpy
from train_helpers import GPT_DIMS, free, reference, rel_err, trainer

DIMS = dict(GPT_DIMS, seq_len=16, layers=4)   # 2 x cp chunks for cp up to 8
STEPS = 3
# (tp, cp, pp, dp) at world sizes 2, 4 and 8
LAYOUTS = {2: [(1, 2, 1, 1)],
           4: [(1, 4, 1, 1), (1, 2, 2, 1)],
           8: [(1, 8, 1, 1), (2, 2, 1, 2), (1, 2, 2, 2), (2, 2, 2, 1), (1, 2, 1, 4)]}


@pytest.fixture(scope="module")
def single_rank(comm):
    """The reference run (COMM_SELF, on every rank): first-step gradients by name, and the losses."""
    t = reference(comm, dims=DIMS)
    t.gradients(0)
    grads = {p.name: to_numpy(p.grad).copy() for p in t.parameters()}
    t.dp.zero_grad()
    out = grads, [t.step(s)[0] for s in range(STEPS)]
    free(t)
    return out


def layout_id(layout):
    return "tp{}cp{}pp{}dp{}".format(*layout)


def check_layout(comm, single_rank, layout, **kw):
    tp, cp, pp, dp = layout
    grads, losses = single_rank
    t = trainer(comm, dims=DIMS, tp=tp, cp=cp, pp=pp, dp=dp, microbatches=2 * pp, **kw)
    t.gradients(0)
    for p in t.parameters() if not kw.get("zero1") else ():     # ZeRO-1: each rank holds a part of them
        want = grads[p.name] if p.shard is None else p.shard.take(grads[p.name])
        # float64; the ring sums attention's softmax in another order: equal to rounding, not bit for bit
        assert rel_err(to_numpy(p.grad), want) <= 1e-10, f"{layout_id(layout)} {kw}: gradient of {p.name}"
    t.dp.zero_grad()
    got = [t.step(s)[0] for s in range(STEPS)]
    free(t)
    assert rel_err(got, losses) <= 1e-10, f"{layout_id(layout)} {kw}: losses {got} vs single rank {losses}"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("layout", [x for n in sorted(LAYOUTS) for x in LAYOUTS[n]], ids=layout_id)
def test_context_parallel_layout_matches_single_rank(comm, single_rank, layout):
    if np.prod(layout) != comm.size:
        pytest.skip(f"a layout of {np.prod(layout)} ranks")
    check_layout(comm, single_rank, layout)


@pytest.mark.mpi(min_size=4)
def test_context_parallel_with_sequence_parallelism_and_zero1(comm, single_rank):
    if comm.size != 4:
        pytest.skip("a layout of 4 ranks")
    check_layout(comm, single_rank, (2, 2, 1, 1), sequence_parallel=True)
    check_layout(comm, single_rank, (1, 2, 1, 2), zero1=True)


@pytest.mark.mpi(min_size=2)
def test_ring_moves_the_formula_bytes(comm):
    """Per attention layer and micro-batch, each cp rank sends cp-1 key/value blocks forward, and in
    the backward cp-1 key/value blocks plus cp key/value gradient blocks: 2 (2cp - 1) + ... blocks of
    (b, heads, T/cp, HS) numbers (docs/context_parallel.md)."""
    if comm.size != 2:
        pytest.skip("2 ranks")
    t = trainer(comm, dims=DIMS, cp=2)
    t.gradients(0)
    cp, cfg, m = 2, t.mcfg, t.micro
    block = 2 * m * cfg.d_model * (cfg.seq_len // cp) * 8           # [K | V] of one rank, float64 bytes
    per_layer = (cp - 1) * block + (cp - 1) * block + cp * block     # forward K/V; backward K/V and dK/dV
    assert t.grid.cp_comm.stats.bytes["send"] == cfg.n_layer * t.cfg.microbatches * per_layer
    free(t)
