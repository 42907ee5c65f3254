"""Muon on real ranks, float64: two steps of every layout give the single rank's losses and weights
within 1e-10 - tensor parallelism's duplicated and distributed modes (GPT-2's fused Q|K|V, Llama's
grouped K/V), pipeline, data, context and expert parallelism, ZeRO 1, 2 and 3 (each matrix whole on its
owner) and HSDP, QK-clip (its maxima too) - and blockwise does not.  One job per
world size, one reference per model, every layout of that size against it."""
import pytest

from hpcpar.optim.matrices import matrix_split
from test_moe_train import MIXTRAL_DIMS
from test_zero_mpi import one_step
from train_helpers import free, reference, rel_err, trainer

GPT = dict(model="tiny", layers=2, hidden=16, heads=4, seq_len=8, synthetic_vocab=29, batch_size=8)
MIXTRAL = dict(MIXTRAL_DIMS, heads=2, kv_heads=2, batch_size=8)
MUON = dict(optimizer="muon", lr=2e-2, ns_steps=3)
QK = 0.01                   # below the tiny models' largest logits (0.012 to 0.03): every step clips

# world size -> (model, layout without dp: dp fills the world); make test runs LAYOUTS, make test-all MORE too
LAYOUTS = {
    2: [(GPT, dict(tp=2)), (GPT, dict(tp=2, muon_tp="distributed")), (GPT, dict(pp=2)), (MIXTRAL, dict(ep=2)),
        (GPT, dict(zero=1)), (MIXTRAL, dict(zero=3))],
    4: [(GPT, dict(tp=2, pp=2)), (GPT, dict(tp=2, muon_tp="distributed", sequence_parallel=True)),
        (MIXTRAL, dict(tp=2, ep=2)), (GPT, dict(tp=2, cp=2, qk_clip=QK)),
        (MIXTRAL, dict(cp=2, cp_kind="ulysses", ep=2, qk_clip=QK)), (GPT, dict(tp=2, zero=1, muon_tp="distributed")),
        (MIXTRAL, dict(ep=2, zero=3))],
    8: [(MIXTRAL, dict(tp=2, cp=2, ep=2, qk_clip=QK)), (GPT, dict(tp=2, pp=2, zero=3, muon_tp="distributed")),
        (MIXTRAL, dict(pp=2, ep=2, zero=3, qk_clip=QK)), (GPT, dict(zero=3, dp_shard=2))],
}
MORE = {
    2: [(GPT, dict(cp=2)), (MIXTRAL, dict(tp=2, muon_tp="distributed"))],
    4: [(GPT, dict(tp=4, muon_tp="distributed")), (MIXTRAL, dict(cp=2, ep=2)), (GPT, dict(pp=2, zero=2)),
        (GPT, dict(cp=2, zero=3, qk_clip=QK))],
    8: [(GPT, dict(tp=2, pp=2, muon_tp="distributed")), (GPT, dict(tp=2, cp=2, pp=2)),
        (MIXTRAL, dict(tp=2, cp=2, ep=2, muon_tp="distributed")), (MIXTRAL, dict(pp=2, ep=4)),
        (GPT, dict(tp=2, cp=2, pp=2, cp_kind="ulysses", qk_clip=QK)), (MIXTRAL, dict(tp=2, cp=2, ep=2, zero=1))],
}


def steps(t, n=2):
    """Each step's (loss, gradients, norm, weights, QK-clip's maxima)."""
    return [one_step(t, s) + (t.qk_clip and t.qk_clip.last.copy(),) for s in range(n)]


@pytest.mark.mpi(min_size=2)
def test_muon_matches_one_rank(comm):
    check_layouts(comm, LAYOUTS)


@pytest.mark.slow
@pytest.mark.mpi(min_size=2)
def test_muon_matches_one_rank_in_more_layouts(comm):
    check_layouts(comm, MORE)


def check_layouts(comm, layouts):
    if comm.size not in layouts:
        pytest.skip("layouts of 2, 4 or 8 ranks")
    wants = {}
    for dims, layout in layouts[comm.size]:
        key = dims["model"], layout.get("qk_clip", 0)
        if key not in wants:
            ref = reference(comm, dims=dims, qk_clip=key[1], **MUON)
            wants[key] = steps(ref)
            free(ref)
        model = layout.get("tp", 1) * layout.get("pp", 1) * layout.get("cp", 1)
        dp = comm.size // model
        t = trainer(comm, dims=dims, dp=dp, microbatches=min(2 * layout.get("pp", 1), dims["batch_size"] // dp),
                    **MUON, **layout)
        if layout.get("zero"):              # Muon under ZeRO: every matrix whole on one rank of its group
            assert t.cfg.whole_tensors and all(t.dp.owner(p) is not None for p in t.parameters() if p.matrix)
        gots = steps(t)
        free(t)
        what = f"{key} {layout}"
        for s, (got, want) in enumerate(zip(gots, wants[key])):
            assert rel_err(got[0], want[0]) <= 1e-10, f"loss differs at step {s} ({what})"
            if key[1]:
                assert (want[4] > QK).any() and rel_err(got[4], want[4]) <= 1e-10, f"maxima differ ({what})"
            for name, value in got[3].items():
                err = rel_err(value, want[3][name])
                assert err <= 1e-10, f"{name} differs by {err:.1e} after step {s} ({what})"


@pytest.mark.mpi(min_size=2)
def test_blockwise_is_another_optimizer(comm):
    """Newton-Schulz on each shard: the same gradients, other weights after the step."""
    if comm.size != 2:
        pytest.skip("tp 2")
    ref = reference(comm, dims=GPT, **MUON)
    want = one_step(ref)
    free(ref)
    t = trainer(comm, dims=GPT, tp=2, muon_tp="blockwise", **MUON)
    got = one_step(t)
    free(t)
    assert rel_err(got[0], want[0]) <= 1e-10
    assert all(rel_err(got[1][n], want[1][n]) <= 1e-10 for n in want[1])
    cut = [n for n in want[3] if "c_attn.weight" in n or "c_fc.weight" in n or "c_proj.weight" in n]
    assert cut and all(rel_err(got[3][n], want[3][n]) > 1e-4 for n in cut)


@pytest.fixture
def shared_dir(comm, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("muon-ckpt")) if comm.rank == 0 else None
    return comm.bcast(path, root=0)


@pytest.mark.mpi(min_size=4)
def test_muon_checkpoints_reshard(comm, shared_dir):
    """Muon's state (a matrix's momentum; AdamW's moments for the rest) saved at tp 2 x dp 2 under ZeRO-1
    (each matrix on its owner) resumes at tp 4, at pp 2 x dp 2 and at dp 4 under ZeRO-3: the third step's
    loss is the straight run's."""
    from hpcpar.checkpoint import load_checkpoint, save_checkpoint
    if comm.size != 4:
        pytest.skip("4 ranks")
    source = dict(dims=GPT, tp=2, dp=2, zero=1, **MUON)
    straight = trainer(comm, **source)
    want = [straight.step(s).loss for s in range(3)]
    free(straight)
    first = trainer(comm, **source)
    for s in range(2):
        first.step(s)
    save_checkpoint(first, shared_dir, 2)
    free(first)
    for target in (dict(tp=4, muon_tp="distributed"), dict(pp=2, dp=2, microbatches=2), dict(dp=4, zero=3)):
        second = trainer(comm, dims=GPT, **MUON, **target)
        assert load_checkpoint(second, shared_dir) == 2
        got = second.step(2).loss
        free(second)
        assert rel_err(got, want[2]) <= 1e-10, (target, got, want[2])


@pytest.mark.mpi(min_size=2)
def test_muon_costs_are_the_engines(comm):
    """tensor_parallel/muon.muon_costs - what the planner charges - is what one step counts: its
    Newton-Schulz FLOPs (NewtonSchulz.flops) and the bytes its optimizer hands the TP group, every mode."""
    from hpcpar.tensor_parallel.muon import MODES, muon_costs
    if comm.size not in (2, 4):
        pytest.skip("tp 2 (and ep 2, ZeRO-1 on 4 ranks)")
    dims, ep, zero = (GPT, 1, 0) if comm.size == 2 else (MIXTRAL, 2, 1)
    for mode in MODES:
        t = trainer(comm, dims=dims, tp=2, dp=comm.size // 2, ep=ep, zero=zero, muon_tp=mode, **MUON)
        losses = t.gradients(0)
        before = sum(c.bytes for c in t.grid.tp_comm.stats.of.values())
        t.update(0, losses)
        sent = sum(c.bytes for c in t.grid.tp_comm.stats.of.values()) - before
        blocks = sum(len(c.blocks) for c in t.chunks)
        want = muon_costs(t.mcfg.shape, blocks, 2, ep, mode, MUON["ns_steps"], 8)
        if zero:                        # each matrix on its owner: the group shares the work, by the mean
            n = t.grid.dp_cp_comm.size
            want = muon_costs(t.mcfg.shape, blocks, 2, ep, mode, MUON["ns_steps"], 8, owners=(n, max(1, n // ep)))
            group = t.grid.dp_cp_comm.mpi
            got = group.allreduce(t.optimizer.ns.flops) / n, group.allreduce(sent) / n
            assert rel_err(got, want) < 1e-12, (mode, got, want)
        else:
            assert (t.optimizer.ns.flops, sent) == want, mode
        free(t)


@pytest.mark.mpi(min_size=4)
def test_muon_state_is_the_formula_and_the_planners(comm):
    """Muon's state on a rank (a momentum for each matrix number, AdamW's two moments for the rest) is,
    byte for byte, zero_memory.formula's and the planner's optimizer-state term; under TP, where both
    count the replicated norms and biases as cut, its matrix part is."""
    from hpcpar.data_parallel.zero_memory import formula, held
    from hpcpar.tools.plan.measured import planner_view
    from hpcpar.tools.plan.memory import stage_memory
    if comm.size != 4:
        pytest.skip("4 ranks")
    for dims, layout in ((GPT, dict(dp=4)), (MIXTRAL, dict(pp=2, dp=2, ep=2)), (MIXTRAL, dict(tp=2, ep=2, dp=2)),
                         (GPT, dict(dp=4, zero=1))):
        t = trainer(comm, dims=dims, **MUON, **layout)
        t.step(0)
        got = held(t)["optimizer state"]
        want = formula(t.cfg, t.mcfg, t.grid.pp_rank)["optimizer state"]
        job, lay = planner_view(t.cfg, t.mcfg)
        planned = stage_memory(job, lay, t.grid.pp_rank, 1)["optimizer state"]
        if layout.get("zero"):          # whole matrices on their owners: the group holds what the table says
            got = t.grid.dp_cp_comm.mpi.allreduce(got) / t.grid.dp_cp_comm.size
        if layout.get("tp", 1) == 1:
            assert got == want == planned, (layout, got, want, planned)
        momentum = sum(st["momentum_buffer"].nbytes for st in t.optimizer.state.values())
        if layout.get("zero"):
            momentum = t.grid.dp_cp_comm.mpi.allreduce(momentum) / t.grid.dp_cp_comm.size
        blocks = sum(len(c.blocks) for c in t.chunks)
        assert momentum == 8 * blocks * sum(matrix_split(t.mcfg.shape, t.cfg.tp, t.cfg.ep)) / \
            (t.grid.dp_cp_comm.size if layout.get("zero") else 1), layout
        free(t)
