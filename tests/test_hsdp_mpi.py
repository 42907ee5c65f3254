"""HSDP (--dp-shard) and whole-tensor ownership (--whole-tensors) on real ranks, float64: one AdamW step's
loss, gradient norm, gradients and weights equal the single rank's within 1e-10, composed with TP (and
SP), every pipeline schedule, CP and EP; ZeRO's gathers stay inside the shard groups; checkpoints written
so load at another layout."""
from dataclasses import replace

import numpy as np
import pytest

from hpcpar.checkpoint import load_checkpoint, save_checkpoint
from test_moe_train import MIXTRAL_DIMS
from test_zero_mpi import one_step
from train_helpers import free, reference, rel_err, trainer

DIMS = dict(model="tiny", layers=4, hidden=16, heads=2, seq_len=8, synthetic_vocab=29, batch_size=16)
REFERENCES = {}             # dims -> the single rank's step: every layout of one dims shares it

# (name, world size, layout); dp fills the world
CASES = [
    ("dp4.hs2.z1", 4, dict(dp_shard=2, zero=1)),
    ("dp4.hs2.z2.whole", 4, dict(dp_shard=2, zero=2, whole_tensors=True)),
    ("dp4.hs2.z3", 4, dict(dp_shard=2, zero=3)),
    ("dp4.z1.whole", 4, dict(zero=1, whole_tensors=True)),
    ("dp4.z3.whole", 4, dict(zero=3, whole_tensors=True)),
    ("cp2.dp2.hs1.z3", 4, dict(cp=2, dp_shard=1, zero=3)),         # the shard group: the cp pair
    ("pp2.dp2.z3.whole", 4, dict(pp=2, zero=3, whole_tensors=True)),                  # tied ends: units alone
    ("dp4.ep2.hs2.z3", 4, dict(ep=2, dp_shard=2, zero=3, dims=MIXTRAL_DIMS)),
    ("tp2.dp4.hs2.sp.z3", 8, dict(tp=2, dp_shard=2, zero=3, sequence_parallel=True)),
    ("tp2.dp4.hs2.z1.whole", 8, dict(tp=2, dp_shard=2, zero=1, whole_tensors=True)),
    ("tp2.pp2.dp2.sp.z2.whole", 8, dict(tp=2, pp=2, zero=2, sequence_parallel=True, whole_tensors=True)),  # late
    ("cp2.dp4.hs2.z2", 8, dict(cp=2, dp_shard=2, zero=2)),
    ("dp8.ep2.hs2.z3", 8, dict(ep=2, dp_shard=2, zero=3, dims=MIXTRAL_DIMS)),     # experts: one rank a group
    ("dp8.ep2.hs4.z2", 8, dict(ep=2, dp_shard=4, zero=2, dims=MIXTRAL_DIMS)),     # experts: two ranks a group
    ("dp8.ep4.hs2.z1.whole", 8, dict(ep=4, dp_shard=2, zero=1, whole_tensors=True,
                                     dims=dict(MIXTRAL_DIMS, experts=4))),
] + [(f"pp2.dp4.hs2.z{2 + i % 2}.{s}", 8, dict(pp=2, dp_shard=2, zero=2 + i % 2, schedule=s, microbatches=4,
                                               **({"chunks": 2} if s == "interleaved" else {})))
     for i, s in enumerate(["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipev"])]


def reference_step(comm, dims):
    key = repr(sorted(dims.items()))
    if key not in REFERENCES:
        ref = reference(comm, dims=dims)
        REFERENCES[key] = one_step(ref)
        free(ref)
    return REFERENCES[key]


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("name, ranks, layout", CASES, ids=[c[0] for c in CASES])
def test_hsdp_and_whole_tensors_match_one_rank(comm, name, ranks, layout):
    if comm.size != ranks:
        pytest.skip(f"a layout of {ranks} ranks")
    layout = dict(layout)
    dims = layout.pop("dims", DIMS)
    model = layout.get("tp", 1) * layout.get("pp", 1) * layout.get("cp", 1)
    want = reference_step(comm, dims)
    t = trainer(comm, dims=dims, dp=comm.size // model, **layout)
    got = one_step(t)
    if layout.get("whole_tensors"):     # every parameter whole on its owner: in its slice, where owner() says
        for i, f in enumerate(t.dp.flats):
            for p, _, _ in f.segments:
                assert f.owner(p) is not None, p.name
            mine = {p.name for p, _, _ in t.dp.slices()[i].segments}
            assert mine == {p.name for p, _, _ in f.segments if f.owner(p) == f.group.rank}
    free(t)
    assert rel_err(got[0], want[0]) <= 1e-10, f"loss differs ({name})"
    assert rel_err(got[2], want[2]) <= 1e-10, f"gradient norm differs ({name})"
    for kind, i in (("gradient", 1), ("weight", 3)):
        for key, value in got[i].items():
            assert rel_err(value, want[i][key]) <= 1e-10, f"{kind} of {key} differs ({name})"


@pytest.mark.mpi(min_size=4)
def test_hsdp_gathers_inside_its_shard_groups_and_sums_across(comm):
    """ZeRO-3 at dp 4, --dp-shard 2: the all-gathers and reduce-scatters run over the shard group only
    (two ranks), and across the groups only the owned ranges' all-reduce - 1/2 of the gradients."""
    if comm.size != 4:
        pytest.skip("dp 4")
    t = trainer(comm, dims=DIMS, dp=4, dp_shard=2, zero=3)
    t.step(0)
    by_name = {c.name: c.stats for c in t.communicators()}
    inside, across = by_name["dp_shard"], by_name["dp_across"]
    grads = sum(f.owned_grad.nbytes for f in t.dp.flats)            # this rank's owned ranges, float64
    free(t)
    assert t.dp.flats[0].group.size == 2 and t.dp.flats[0].across.size == 2
    assert inside.bytes["all_gather"] > 0 and inside.bytes["reduce_scatter"] > 0
    assert across.bytes["all_gather"] == across.bytes["reduce_scatter"] == 0
    assert across.bytes["all_reduce"] == grads


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("zero", [1, 2, 3])
def test_hsdp_memory_is_the_planners_and_the_engines(comm, zero):
    """Under --dp-shard 2 a rank holds the state of a shard group of two, whatever dp: the engine's formula
    (what --memory-budget checks) and the planner's terms are the same numbers, and the arrays the engine
    holds after a step are those numbers (the working set within 10 %: MPI's timing frees gradients early)."""
    from hpcpar.data_parallel.zero_memory import formula, held
    from hpcpar.tools.plan.measured import planner_view
    from hpcpar.tools.plan.memory import stage_memory
    if comm.size != 4:
        pytest.skip("dp 4")
    t = trainer(comm, dp=4, dp_shard=2, zero=zero, dtype="float32")
    t.step(0)
    got, want = held(t), formula(t.cfg, t.mcfg)
    job, layout = planner_view(t.cfg, t.mcfg)
    planned = stage_memory(job, layout, 0, 1)
    free(t)
    assert layout.shard == 2 and layout.across == 2
    for term, value in want.items():
        assert planned.get(term, 0) == pytest.approx(value, rel=1e-12), term
        assert got[term] == pytest.approx(value, rel=0.1 if term == "ZeRO working set" else 1e-12), term
    plain = formula(replace(t.cfg, dp_shard=0), t.mcfg)                 # the same run sharded over all four
    assert plain["optimizer state"] == want["optimizer state"] / 2


@pytest.fixture
def shared_dir(comm, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hsdp-ckpt")) if comm.rank == 0 else None
    return comm.bcast(path, root=0)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("source, target", [(dict(dp_shard=2, zero=3, whole_tensors=True), dict(zero=1)),
                                            (dict(zero=2), dict(dp_shard=2, zero=1, whole_tensors=True))],
                         ids=["hsdp.whole-to-z1", "z2-to-hsdp.whole"])
def test_a_checkpoint_moves_between_hsdp_whole_tensors_and_plain_zero(comm, shared_dir, source, target):
    """Two steps under one layout, saved; the third step under the other is the single rank's."""
    if comm.size != 4:
        pytest.skip("dp 4")
    ref = reference(comm, dims=DIMS)
    want = [ref.step(s).loss for s in range(3)]
    free(ref)
    first = trainer(comm, dims=DIMS, dp=4, **source)
    [first.step(s) for s in range(2)]
    save_checkpoint(first, shared_dir, 2)
    free(first)
    second = trainer(comm, dims=DIMS, dp=4, **target)
    assert load_checkpoint(second, shared_dir) == 2
    got = second.step(2).loss
    free(second)
    assert rel_err(got, want[2]) <= 1e-10, (got, want[2])
    assert np.isfinite(got)
