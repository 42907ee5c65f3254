"""Mixtures of experts on real ranks, float64, dropless: data parallelism, pipelines (with recomputation) give the
single-rank step's loss and every gradient within 1e-10 (routing is per token, so splitting the batch
or the layers changes no token's experts)."""
import pytest

from test_moe_train import MIXTRAL_DIMS, MOE_DIMS
from train_helpers import check_step


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dims", [MOE_DIMS, MIXTRAL_DIMS], ids=["gpt2", "llama"])
def test_data_and_pipeline_parallel_experts_match_one_rank(comm, dims):
    check_step(comm, dp=comm.size, dims=dict(dims, shared_experts=1))
    check_step(comm, pp=2, dp=comm.size // 2, microbatches=2, dims=dims, recompute=True)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dims", [MOE_DIMS, MIXTRAL_DIMS], ids=["gpt2", "llama"])
def test_expert_parallel_matches_one_rank(comm, dims):
    """ep 2 and (at 4 ranks) ep 4: the rows go to the experts' ranks and back by all-to-all."""
    for ep in (2, 4):
        if comm.size % ep == 0:
            check_step(comm, dp=comm.size, ep=ep, dims=dict(dims, experts=4, shared_experts=1))
    check_step(comm, cp=2, dp=comm.size // 2, ep=2, dims=dims)      # ep over context-parallel ranks
    if comm.size >= 4:       # with a pipeline and recomputation: the all-to-alls run again in the backward
        check_step(comm, pp=2, dp=comm.size // 2, ep=2, microbatches=2, recompute=True, dims=dims)


MIXTRAL_TP = dict(MIXTRAL_DIMS, kv_heads=2)          # tp 2 cuts the K/V heads too
# QK-norm: each TP rank its heads'; heads of 12 over hidden 16 / 2 heads = 8 (Qwen3's are wider than C / NH too)
QWEN3_TP = dict(MIXTRAL_TP, model="qwen3-moe-tiny", norm_topk=False, head_dim=12)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("dims", [MOE_DIMS, MIXTRAL_TP, QWEN3_TP], ids=["gpt2", "llama", "qwen3-moe"])
def test_tensor_and_expert_parallel_match_one_rank(comm, dims):
    """tp 2 x ep 2: attention cut over TP, the experts whole on both TP ranks (each runs the MoE on the
    same tokens), or with sequence parallelism each routing its own half of the sequence."""
    if comm.size != 4:
        pytest.skip("tp 2 x dp 2")
    check_step(comm, tp=2, dp=2, ep=2, dims=dict(dims, shared_experts=1))
    check_step(comm, tp=2, dp=2, ep=2, sequence_parallel=True, dims=dims)


@pytest.mark.mpi(min_size=8)
def test_eight_rank_expert_parallel_layouts_match_one_rank(comm):
    if comm.size != 8:
        pytest.skip("layouts of exactly 8 ranks")
    check_step(comm, dp=8, ep=8, dims=dict(MIXTRAL_DIMS, experts=8))
    check_step(comm, pp=2, dp=4, ep=4, microbatches=2, dims=MIXTRAL_DIMS)
    check_step(comm, tp=2, pp=2, dp=2, ep=2, microbatches=2, dims=MIXTRAL_TP)
    check_step(comm, tp=2, pp=2, dp=2, ep=2, microbatches=2, dims=QWEN3_TP)


def hf_family(name):
    """(the builder of a small random model of the family, its vocabulary), from its serial tests."""
    if name == "mixtral":
        from test_moe_hf import MIXTRAL_DIMS as dims, hf_mixtral as build
    else:
        from test_qwen3_moe_hf import QWEN3_MOE_DIMS as dims, hf_qwen3_moe as build
    return build, dims["vocab_size"]


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("layout", [dict(pp=2, dp=2, ep=2), dict(tp=2, pp=2, dp=1), dict(tp=2, pp=2, dp=2, ep=2)],
                         ids=["pp2-dp2-ep2", "tp2-pp2", "tp2-pp2-dp2-ep2"])
def test_hugging_face_moe_gives_transformers_loss_in_parallel(comm, tmp_path_factory, layout, family):
    """Mixtral and Qwen3-MoE (QK-norm, heads wider than hidden / heads; its top-k scores left raw here) loaded
    on 4 and 8 ranks."""
    check_hf_in_parallel(comm, tmp_path_factory, layout, family, {} if family == "mixtral" else
                         dict(norm_topk_prob=False))


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_hugging_face_sliding_window_gives_transformers_loss_on_eight_ranks(comm, tmp_path_factory, family):
    """A sliding window of 5 over windows of 12 tokens, at tp 2 x cp 2 (the ring trims its blocks to the
    window) x pp 2 x ep 2."""
    window = dict(sliding_window=5) if family == "mixtral" else dict(use_sliding_window=True, sliding_window=5)
    check_hf_in_parallel(comm, tmp_path_factory, dict(tp=2, cp=2, pp=2, dp=1, ep=2), family, window)


def check_hf_in_parallel(comm, tmp_path_factory, layout, family, hf_dims):
    """The family's small random model (``hf_dims`` its config's changes) loaded at ``layout``: its whole
    weights gathered back as the file holds them, and transformers' loss of a batch in float64."""
    import numpy as np
    from hf_helpers import hf_loss, save_hf, transformers
    from hpcpar.checkpoint.consolidated import gather_full, init_from, read_weights
    from train_helpers import trainer
    if comm.size != layout.get("tp", 1) * layout.get("cp", 1) * layout["pp"] * layout["dp"]:
        pytest.skip(f"a layout of {comm.size} ranks")
    transformers()                                   # every rank skips together, or none does
    build, vocab = hf_family(family)
    path = comm.bcast(str(tmp_path_factory.mktemp(family)) if comm.rank == 0 else None, root=0)
    tokens = np.random.default_rng(5).integers(0, vocab, size=(4, 13))
    x, y = tokens[:, :-1], tokens[:, 1:]
    want = None
    if comm.rank == 0:
        model = build(**hf_dims)
        save_hf(model, f"{path}/hf")
        want = hf_loss(model, x, y)
    want = comm.bcast(want, root=0)
    t = trainer(comm, **layout, microbatches=2, init_from=f"{path}/hf", layers=0, hidden=0, heads=0,
                seq_len=12, batch_size=4, dims=dict(MIXTRAL_DIMS, model="", kv_heads=0, ffn=0))
    assert t.mcfg.qk_norm == (family == "qwen3_moe") and t.mcfg.window == hf_dims.get("sliding_window", 0)
    init_from(t, f"{path}/hf")
    full = gather_full(t)                            # what --export writes: every expert once, whole
    if comm.rank == 0:
        for name, w in read_weights(f"{path}/hf").items():
            np.testing.assert_array_equal(full[name], w, err_msg=name)
    t.data.batch = lambda step, ids: (x[list(ids)], y[list(ids)])
    losses = t.gradients(0)
    mine = sum(float(v) for v in losses) if (t.computes_loss and t.grid.tp_rank == 0) else 0.0
    got = float(t.grid.world_comm.all_reduce(np.array([mine]))[0]) / t.loss_terms
    assert got == pytest.approx(want, rel=1e-10)


@pytest.mark.mpi(min_size=2)
def test_steps_with_zero1_and_the_routing_bias_follow_one_rank(comm):
    """Three AdamW steps at dp x ep with ZeRO-1 and DeepSeek-V3's bias (moved by the job's counts):
    the single rank's losses and biases."""
    from train_helpers import free, reference, rel_err, trainer
    kw = dict(dims=dict(MIXTRAL_DIMS, bias_rate=0.01), lr=1e-2)
    ref, t = reference(comm, **kw), trainer(comm, dp=comm.size, ep=2, zero1=True, **kw)
    for s in range(3):
        want, got = ref.step(s).loss, t.step(s).loss
        assert rel_err(got, want) <= 1e-10, f"step {s}"
    for a, b in zip(t.chunks[0].blocks, ref.chunks[0].blocks):
        assert rel_err(a.mlp.bias.data, b.mlp.bias.data) <= 1e-12 and abs(b.mlp.bias.data).max() > 0
    free(t)
    free(ref)


@pytest.mark.mpi(min_size=2)
def test_the_all_to_all_spans_carry_their_bytes(comm):
    """A traced step: each 'ep all_to_allv' span holds the bytes its rank handed MPI; over the job they are
    the rows of every choice, four times (dispatch and combine, forward and backward) per layer."""
    import numpy as np
    from hpcpar import tracer as trace
    from train_helpers import free, trainer
    t = trainer(comm, dp=comm.size, ep=2, dims=MOE_DIMS)
    trace.start("moe")
    t.step(0)
    spans = [e for e in trace.stop().events if e[1] == "collective" and e[0].startswith("ep all_to_all")]
    mine = {name: sum(args["bytes"] for n, *_, args in spans if n == name)
            for name in ("ep all_to_allv", "ep all_to_all")}
    total = {k: t.grid.world_comm.all_reduce(np.array([v]))[0] for k, v in mine.items()}
    L, C, k, E = MOE_DIMS["layers"], MOE_DIMS["hidden"], 2, 4
    tokens = MOE_DIMS["batch_size"] * MOE_DIMS["seq_len"]
    assert total["ep all_to_allv"] == 4 * L * tokens * k * C * 8
    assert total["ep all_to_all"] == comm.size * L * E * 8        # the counts, once a layer and micro-batch
    free(t)
