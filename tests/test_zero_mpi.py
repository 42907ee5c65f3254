"""ZeRO-2 and ZeRO-3 on real ranks, float64: the loss, every gradient and every weight after one AdamW
step equal the single rank's within 1e-10, composed with TP (and SP), CP, PP and its schedules (the V-shaped ones too), both
ways of --reshard-after-forward."""
import numpy as np
import pytest

from test_moe_train import MIXTRAL_DIMS, MOE_DIMS
from train_helpers import free, global_loss, reference, rel_err, trainer

# (name, layout without dp: dp fills the world)
CASES = [
    ("dp.z3", dict(zero=3)),
    ("tp2.sp.z3", dict(tp=2, sequence_parallel=True, zero=3)),
    ("tp2.pp2.z3.1f1b", dict(tp=2, pp=2, zero=3, microbatches=4)),
    ("tp2.pp2.z3.interleaved", dict(tp=2, pp=2, zero=3, schedule="interleaved", chunks=2, microbatches=4)),
    ("cp2.z3", dict(cp=2, zero=3)),
    ("pp2.z2.zb-h1", dict(pp=2, zero=2, schedule="zb-h1", microbatches=4)),
    ("pp2.z3.zb-h1.recompute", dict(pp=2, zero=3, schedule="zb-h1", microbatches=4, recompute=True)),
    ("pp2.z3.gpipe.3-block-units", dict(pp=2, zero=3, schedule="gpipe", microbatches=2, fsdp_blocks=3)),
    ("pp2.z3.zb-v", dict(pp=2, zero=3, schedule="zb-v", microbatches=4)),               # the V: two chunks a rank
    ("pp2.z2.dualpipev", dict(pp=2, zero=2, schedule="dualpipev", microbatches=4)),
]


def tensors(t, what):
    """{name: full tensor} of this layout: gathered over DP x CP (ZeRO; an expert's over its own group),
    then assembled over TP (an expert's over its ep group)."""
    local = {k: v.copy() for k, v in t.dp.gathered(what).items()}
    out = {}
    for p in t.parameters():
        mine, comm = local[p.name], t.ep_comm if p.expert else t.grid.tp_comm
        out[p.name] = mine if p.shard is None else p.shard.assemble(comm.mpi.allgather(mine), p.full_shape)
    return out


def one_step(t, step=0):
    """(loss, gradients, grad norm, weights after the step) of step ``step``."""
    losses = t.gradients(step)
    grads = tensors(t, "grad")
    result = t.update(step, losses)
    return result.loss, grads, result.grad_norm, tensors(t, "data")


def check_exact(comm, steps=1, **kw):
    """``steps`` steps of this layout: each one's loss, gradient norm, gradients and weights after it are
    the single rank's.  Returns the weights after the last."""
    ref = reference(comm, **kw)
    wants = [one_step(ref, s) for s in range(steps)]
    free(ref)
    t = trainer(comm, **kw)
    gots = [one_step(t, s) for s in range(steps)]
    free(t)
    what = ", ".join(f"{k}={v}" for k, v in kw.items())
    for s, (got, want) in enumerate(zip(gots, wants)):
        assert rel_err(got[0], want[0]) <= 1e-10, f"loss differs at step {s} ({what})"
        assert rel_err(got[2], want[2]) <= 1e-10, f"gradient norm differs at step {s} ({what})"
        for kind, i in (("gradient", 1), ("weight", 3)):
            for name, value in got[i].items():
                err = rel_err(value, want[i][name])
                assert err <= 1e-10, f"{kind} of {name} differs by {err:.1e} at step {s} ({what})"
    return gots[-1][3]


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("reshard", [True, False], ids=["reshard", "keep"])
@pytest.mark.parametrize("name, layout", CASES, ids=[c[0] for c in CASES])
def test_zero_matches_one_rank(comm, name, layout, reshard):
    if comm.size not in (4, 8):
        pytest.skip("layouts of 4 or 8 ranks")
    if layout["zero"] != 3 and not reshard:
        pytest.skip("--reshard-after-forward is ZeRO-3's")
    model = layout.get("tp", 1) * layout.get("pp", 1) * layout.get("cp", 1)
    if comm.size // model < 2:                  # 4 ranks: the same layout without TP
        layout = {k: v for k, v in layout.items() if k not in ("tp", "sequence_parallel")}
        model //= 2
    extra = {} if reshard else dict(reshard_after_forward=False)
    check_exact(comm, dp=comm.size // model, **layout, **extra)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_zero3_in_low_precision_matches_one_rank(comm, precision):
    """Gathers in the compute dtype, fp32 master slices: the single rank's losses in that precision, to
    a quarter of its epsilon (as tests/test_precision_mpi.py bounds every layout)."""
    if comm.size not in (4, 8):
        pytest.skip("layouts of 4 or 8 ranks")
    kw = dict(pp=2, dp=comm.size // 2, microbatches=2, zero=3, dtype="float32", precision=precision)
    t = trainer(comm, **kw)
    got = [t.step(s).loss for s in range(2)]
    free(t)
    ref = reference(comm, **kw)
    want = [ref.step(s).loss for s in range(2)]
    free(ref)
    eps = float(np.finfo(np.float16).eps) if precision == "fp16" else 2.0 ** -7
    assert rel_err(got, want) <= 0.25 * eps, (got, want)


@pytest.mark.mpi(min_size=4)
def test_resident_experts_round_their_compute_copy_each_step(comm):
    """At ep = dp x cp an expert's group is its own rank: its unit stays whole (resident); under bf16
    its compute copy is rounded again from the updated fp32 masters after each step."""
    if comm.size != 4:
        pytest.skip("dp 4 x ep 4")
    kw = dict(dp=4, ep=4, zero=3, dims=dict(MIXTRAL_DIMS, experts=4), dtype="float32", precision="bf16", lr=1e-2)
    t = trainer(comm, **kw)
    got = [t.step(s).loss for s in range(2)]
    resident = [u for u in t.dp.flats if u.resident]
    assert resident and all(p.expert for u in resident for p in u.params)
    for u in resident:
        np.testing.assert_array_equal(u.compute, u.master.astype(u.compute.dtype))
    free(t)
    ref = reference(comm, **kw)
    want = [ref.step(s).loss for s in range(2)]
    free(ref)
    assert rel_err(got, want) <= 0.25 * 2.0 ** -7, (got, want)


@pytest.mark.mpi(min_size=8)
def test_eight_ranks_with_zero3_train_what_one_rank_may_not_hold(comm):
    """The budget one rank is refused under (tests/test_zero.py) admits 8 ranks with ZeRO-3."""
    if comm.size != 8:
        pytest.skip("8 ranks")
    small = dict(model="small", batch_size=8, seq_len=32, synthetic_vocab=29)
    t = trainer(comm, dims=small, dp=8, zero=3, memory_budget=0.03, dtype="float32")
    loss = t.step(0).loss
    free(t)
    assert np.isfinite(loss)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("zero", [1, 2, 3])
def test_the_arrays_held_are_the_formula_and_the_planners(comm, zero):
    """What the engine's arrays hold after a step (zero_memory.held) is, within 10 %, the one table's
    prediction: the engine's formula and the planner's terms (both zero_memory.per_rank)."""
    from hpcpar.data_parallel.zero_memory import TERMS, formula, held
    from hpcpar.tools.plan.measured import planner_view
    from hpcpar.tools.plan.memory import stage_memory
    t = trainer(comm, dp=comm.size, zero=zero, dtype="float32")
    t.step(0)
    got = sum(held(t).values())
    job, layout = planner_view(t.cfg, t.mcfg)
    planned = stage_memory(job, layout, 0, 1)
    free(t)
    assert abs(sum(formula(t.cfg, t.mcfg).values()) / got - 1) <= 0.1
    assert abs(sum(planned.get(k, 0) for k in TERMS) / got - 1) <= 0.1


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("layout", [dict(dp=4, ep=2, zero=1), dict(dp=4, ep=4, zero=2),
                                    dict(tp=2, dp=2, ep=2, zero=1, sequence_parallel=True),
                                    dict(dp=4, ep=2, zero=3), dict(dp=4, ep=2, zero=3, reshard_after_forward=False),
                                    dict(dp=4, ep=4, zero=3), dict(tp=2, dp=2, ep=2, zero=3, sequence_parallel=True),
                                    dict(pp=2, dp=2, ep=2, zero=3, microbatches=2),
                                    dict(dp=4, ep=2, zero=3, bias_rate=0.01)],
                         ids=["dp4.ep2.z1", "dp4.ep4.z2", "tp2.dp2.ep2.z1.sp", "dp4.ep2.z3", "dp4.ep2.z3.keep",
                              "dp4.ep4.z3", "tp2.dp2.ep2.z3.sp", "pp2.dp2.ep2.z3", "dp4.ep2.z3.bias"])
def test_the_formula_counts_the_experts_cut(comm, layout):
    """A rank holds E/ep routed experts, whole over TP, sliced over their own group (dp x cp / ep; ZeRO-3
    gathers them with their block, or over a group of one keeps them whole): the formula --memory-budget
    checks counts them so (within 1 %: it counts replicated norms as cut).  ZeRO-3's working set is a
    bound: one full gradient of it, U numbers, is freed early when its reduce-scatter completes before
    the next one is allocated, which MPI's timing decides."""
    from hpcpar.data_parallel.zero_memory import formula, held, rank_params
    if comm.size != 4:
        pytest.skip("layouts of 4 ranks")
    t = trainer(comm, model="moe-tiny", dtype="float32", **layout)
    t.step(0)
    got, want = held(t), formula(t.cfg, t.mcfg, t.grid.pp_rank)
    early = rank_params(t.cfg, t.mcfg, t.grid.pp_rank)[2] * 4 if t.cfg.zero == 3 else 0      # U g, float32
    free(t)
    assert 0.99 * (sum(want.values()) - early) <= sum(got.values()) <= 1.01 * sum(want.values()), (got, want)


# ZeRO-3 with experts: (name, ranks, layout, --reshard-after-forward); the experts' units are sliced
# over their own group, dp x cp / ep ranks (of one rank at dp 4 ep 4: resident, never gathered)
EXPERT_CASES = [
    ("dp4.ep2.z3", 4, dict(dp=4, ep=2, dims=MIXTRAL_DIMS), True),
    ("dp4.ep4.z3.keep", 4, dict(dp=4, ep=4, dims=dict(MOE_DIMS, experts=4, shared_experts=1)), False),
    ("tp2.dp2.ep2.sp.z3.keep", 4, dict(tp=2, dp=2, ep=2, sequence_parallel=True, dims=MOE_DIMS), False),
    ("cp2.dp2.ep2.z3.2-block-units", 4, dict(cp=2, dp=2, ep=2, fsdp_blocks=2, dims=MIXTRAL_DIMS), True),
    ("dp8.ep4.z3", 8, dict(dp=8, ep=4, dims=MIXTRAL_DIMS), True),
    ("tp2.dp4.ep2.z3.keep", 8, dict(tp=2, dp=4, ep=2, dims=dict(MIXTRAL_DIMS, kv_heads=2)), False),
    ("pp2.dp4.ep2.z3.zb-h1.recompute", 8, dict(pp=2, dp=4, ep=2, schedule="zb-h1", microbatches=2, recompute=True,
                                                dims=MOE_DIMS), True),
]


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("name, ranks, layout, reshard", EXPERT_CASES, ids=[c[0] for c in EXPERT_CASES])
def test_zero3_with_experts_matches_one_rank(comm, name, ranks, layout, reshard):
    if comm.size != ranks:
        pytest.skip(f"a layout of {ranks} ranks")
    check_exact(comm, zero=3, reshard_after_forward=reshard, **layout)


# DeepSeek-V3's routing bias under ZeRO-3: (name, ranks, layout, --reshard-after-forward).  Every rank keeps
# it whole (a resident unit over a group of one) and moves it after each step from the job's counts
BIAS_CASES = [
    ("dp4.ep2.z3", 4, dict(dp=4, ep=2, dims=MIXTRAL_DIMS), True),
    ("dp4.ep2.z3.keep", 4, dict(dp=4, ep=2, dims=MIXTRAL_DIMS), False),
    ("dp8.ep4.z3", 8, dict(dp=8, ep=4, dims=MIXTRAL_DIMS), True),
    ("tp2.dp4.ep2.z3.keep", 8, dict(tp=2, dp=4, ep=2, dims=dict(MIXTRAL_DIMS, kv_heads=2)), False),
    ("pp2.dp4.ep4.z3.2-block-units", 8, dict(pp=2, dp=4, ep=4, microbatches=2, fsdp_blocks=2,
                                             dims=dict(MIXTRAL_DIMS, layers=4)), True),
]


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("name, ranks, layout, reshard", BIAS_CASES, ids=[c[0] for c in BIAS_CASES])
def test_zero3_moves_the_routing_bias_as_one_rank(comm, name, ranks, layout, reshard):
    """Three AdamW steps with --bias-rate: losses, gradients (the bias's: zero) and weights - the bias
    too, moved by the counts - are the single rank's after each step."""
    if comm.size != ranks:
        pytest.skip(f"a layout of {ranks} ranks")
    layout = dict(layout, dims=dict(layout["dims"], bias_rate=0.01))
    weights = check_exact(comm, steps=3, zero=3, reshard_after_forward=reshard, lr=1e-2, **layout)
    biases = [w for name, w in weights.items() if name.endswith("e_score_correction_bias")]
    assert biases and all(np.abs(b).max() > 0 for b in biases)


@pytest.mark.mpi(min_size=4)
def test_zero3_rounds_the_routing_bias_compute_copy_after_it_moves(comm):
    """Under bf16 the bias's unit keeps fp32 masters and a bf16 compute copy: the rule moves the masters
    and rounds the copy again, so the copy is the rounded masters after every step."""
    if comm.size != 4:
        pytest.skip("dp 4 x ep 2")
    kw = dict(dp=4, ep=2, zero=3, dims=dict(MIXTRAL_DIMS, bias_rate=0.01), dtype="float32", precision="bf16",
              lr=1e-2)
    t = trainer(comm, **kw)
    got = [t.step(s).loss for s in range(2)]
    kept = [u for u in t.dp.flats if any(p.name.endswith("e_score_correction_bias") for p in u.params)]
    assert kept and all(u.resident and len(u.params) == 1 and u.compute.dtype != u.master.dtype for u in kept)
    for u in kept:
        assert np.abs(u.master).max() > 0
        np.testing.assert_array_equal(u.compute, u.master.astype(u.compute.dtype))
    # its dp x cp copies are one parameter: a gradient on it would count once in the global norm
    for u in kept:
        u.owned_grad[...] = 1.0
    once = t.grid.world_comm.mpi.allreduce(float(t.dp.norm_sq(t.dp.slices())))
    assert once == sum(u.size for u in kept) == 2 * 4                      # 2 layers x 4 experts
    free(t)
    ref = reference(comm, **kw)
    want = [ref.step(s).loss for s in range(2)]
    free(ref)
    assert rel_err(got, want) <= 0.25 * 2.0 ** -7, (got, want)
