"""Expert parallelism holds each expert once per ep group: a rank's expert arrays are E / ep of the total, its
optimizer state too; the clipped steps follow the single rank (the global norm counts each expert once), and a
checkpoint moves between ep sizes (ep 2 -> ep 4 -> one rank) with the single rank's numbers (float64)."""
import numpy as np
import pytest

from hpcpar.checkpoint import load_checkpoint, save_checkpoint
from hpcpar.checkpoint.consolidated import gather_full
from test_moe_train import MIXTRAL_DIMS
from train_helpers import free, reference, rel_err, trainer

DIMS = dict(MIXTRAL_DIMS, experts=4)
STEPS = dict(dims=DIMS, lr=1e-2, grad_clip=0.05)          # the clip acts at every step (norms ~0.3)


@pytest.fixture
def shared_dir(comm, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("moe-ckpt")) if comm.rank == 0 else None
    return comm.bcast(path, root=0)


def expert_numbers(t):
    """(expert numbers this rank holds, of its optimizer state) over the model's experts."""
    held = {id(p) for p in t.parameters() if p.expert}
    weights = sum(p.data.size for p in t.parameters() if p.expert)
    state = sum(a.size for i, b in enumerate(t.dp.flats) if all(id(p) in held for p in b.params)
                for a in t.optimizer.state.get(i, {}).values())
    return weights, state


@pytest.mark.mpi(min_size=4)
def test_a_rank_holds_its_share_of_the_experts(comm):
    if comm.size != 4:
        pytest.skip("dp 4")
    ref = reference(comm, **STEPS)
    ref.step(0)
    total = sum(p.data.size for p in ref.parameters() if "experts" in p.name)
    per_number = sum(a.size for st in ref.optimizer.state.values() for a in st.values()) \
        // sum(p.data.size for p in ref.parameters())               # AdamW: two moments
    total_state = per_number * total
    for ep, zero in ((2, 0), (4, 0), (2, 1)):
        t = trainer(comm, dp=4, ep=ep, zero=zero, **STEPS)
        t.step(0)
        experts = [p for p in t.parameters() if p.expert]
        assert experts and all(p.data.shape[0] == DIMS["experts"] // ep for p in experts)
        weights, state = expert_numbers(t)
        edp = 4 // ep                                    # ZeRO cuts the experts' state over their own group
        assert weights == total // ep
        assert state == total_state // ep // (edp if zero else 1)
        free(t)
    free(ref)


@pytest.mark.mpi(min_size=4)
def test_ep2_to_ep4_to_one_rank_resumes_with_the_single_rank_numbers(comm, shared_dir):
    from mpi4py import MPI
    if comm.size != 4:
        pytest.skip("dp 4 with ep 2, then ep 4")
    ref = reference(comm, **STEPS)
    want = [ref.step(s) for s in range(6)]
    assert all(r.grad_norm > STEPS["grad_clip"] for r in want)
    first = trainer(comm, dp=4, ep=2, zero=2, **STEPS)
    got = [first.step(s) for s in range(2)]
    save_checkpoint(first, f"{shared_dir}/a", 2)
    free(first)
    second = trainer(comm, dp=2, pp=2, microbatches=2, ep=2, zero=1, **STEPS)
    assert load_checkpoint(second, f"{shared_dir}/a") == 2
    got += [second.step(s) for s in range(2, 3)]
    save_checkpoint(second, f"{shared_dir}/b", 3)
    free(second)
    third = trainer(comm, dp=4, ep=4, **STEPS)
    assert load_checkpoint(third, f"{shared_dir}/b") == 3
    got += [third.step(s) for s in range(3, 5)]
    save_checkpoint(third, f"{shared_dir}/c", 5)
    exported = gather_full(third)                        # the consolidated weights: every expert, once
    free(third)
    alone = trainer(MPI.COMM_SELF, **STEPS)
    assert load_checkpoint(alone, f"{shared_dir}/c") == 5
    if comm.rank == 0:
        mine = {p.name: p.data for p in alone.parameters()}
        assert exported.keys() == mine.keys()
        for name, w in exported.items():
            np.testing.assert_array_equal(w, mine[name])
    got += [alone.step(5)]
    for s, (g, w) in enumerate(zip(got, want)):
        assert rel_err(g.loss, w.loss) <= 1e-10 and rel_err(g.grad_norm, w.grad_norm) <= 1e-10, f"step {s}"
    free(alone)
    free(ref)


@pytest.mark.mpi(min_size=4)
def test_zero3_with_experts_resumes_exactly_and_reshards(comm, shared_dir):
    """ZeRO-3 at dp 4 ep 2 (each expert sliced over its group of 2) resumes bit for bit, then moves to
    ep 4 (a group of one: the experts resident, whole) and to one rank with the single rank's numbers."""
    from mpi4py import MPI
    if comm.size != 4:
        pytest.skip("dp 4 with ep 2, then ep 4")
    ref = reference(comm, **STEPS)
    want = [ref.step(s) for s in range(5)]
    first = trainer(comm, dp=4, ep=2, zero=3, **STEPS)
    got = [first.step(s) for s in range(2)]
    save_checkpoint(first, f"{shared_dir}/a", 2)
    exported = gather_full(first)
    straight = first.step(2)
    free(first)
    second = trainer(comm, dp=4, ep=2, zero=3, **STEPS)
    assert load_checkpoint(second, f"{shared_dir}/a") == 2
    again = gather_full(second)
    if comm.rank == 0:
        assert sorted(again) == sorted(exported)
        for name, w in exported.items():
            np.testing.assert_array_equal(again[name], w)
    got.append(second.step(2))
    assert (got[2].loss, got[2].grad_norm) == (straight.loss, straight.grad_norm)
    save_checkpoint(second, f"{shared_dir}/b", 3)
    free(second)
    third = trainer(comm, dp=4, ep=4, zero=3, reshard_after_forward=False, **STEPS)
    assert all(u.resident == any(p.expert for p in u.params) for u in third.dp.flats)
    assert load_checkpoint(third, f"{shared_dir}/b") == 3
    got.append(third.step(3))
    save_checkpoint(third, f"{shared_dir}/c", 4)
    free(third)
    alone = trainer(MPI.COMM_SELF, **STEPS)
    assert load_checkpoint(alone, f"{shared_dir}/c") == 4
    got.append(alone.step(4))
    for s, (g, w) in enumerate(zip(got, want)):
        assert rel_err(g.loss, w.loss) <= 1e-10 and rel_err(g.grad_norm, w.grad_norm) <= 1e-10, f"step {s}"
    free(alone)
    free(ref)


def biases(t):
    """{name: a copy of the values} of the routing biases this rank holds."""
    return {p.name: p.master_data().copy() for p in t.parameters() if p.name.endswith("e_score_correction_bias")}


@pytest.mark.mpi(min_size=4)
def test_zero3_saves_the_routing_bias_once_and_resumes_it_exactly(comm, shared_dir):
    """DeepSeek-V3's routing bias, whole on every ZeRO-3 rank, is written once (by rank 0 of dp x cp) and
    comes back whole: ZeRO-1 -> ZeRO-3 -> ZeRO-3 without resharding (bit for bit) -> one rank, with the
    single rank's numbers, the bias's too."""
    from pathlib import Path
    from mpi4py import MPI
    from safetensors import safe_open
    if comm.size != 4:
        pytest.skip("dp 4 with ep 2")
    kw = dict(STEPS, dims=dict(DIMS, bias_rate=0.01))
    ref = reference(comm, **kw)
    want = [ref.step(s) for s in range(5)]
    first = trainer(comm, dp=4, ep=2, zero=1, **kw)
    got = [first.step(s) for s in range(2)]
    save_checkpoint(first, f"{shared_dir}/a", 2)
    free(first)
    second = trainer(comm, dp=4, ep=2, zero=3, **kw)
    assert load_checkpoint(second, f"{shared_dir}/a") == 2
    got.append(second.step(2))
    save_checkpoint(second, f"{shared_dir}/b", 3)
    saved = biases(second)
    straight = second.step(3)
    free(second)
    third = trainer(comm, dp=4, ep=2, zero=3, reshard_after_forward=False, **kw)
    assert load_checkpoint(third, f"{shared_dir}/b") == 3
    loaded = biases(third)
    assert loaded.keys() == saved.keys() and all(np.array_equal(loaded[k], saved[k]) for k in saved)
    got.append(third.step(3))
    assert (got[3].loss, got[3].grad_norm) == (straight.loss, straight.grad_norm)
    save_checkpoint(third, f"{shared_dir}/c", 4)
    free(third)
    if comm.rank == 0:                                   # each bias in one rank's file, once
        files = sorted(Path(f"{shared_dir}/c").glob("step-*/rank-*.safetensors"))
        for name in saved:
            assert sum(name in safe_open(f, "np").keys() for f in files) == 1, name
    alone = trainer(MPI.COMM_SELF, **kw)
    assert load_checkpoint(alone, f"{shared_dir}/c") == 4
    got.append(alone.step(4))
    for s, (g, w) in enumerate(zip(got, want)):
        assert rel_err(g.loss, w.loss) <= 1e-10 and rel_err(g.grad_norm, w.grad_norm) <= 1e-10, f"step {s}"
    mine, theirs = biases(alone), biases(ref)
    assert all(rel_err(mine[k], theirs[k]) <= 1e-10 and np.abs(theirs[k]).max() > 0 for k in theirs)
    free(alone)
    free(ref)
