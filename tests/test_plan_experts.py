"""The planner's mixture of experts (hpcpar/tools/plan/experts.py): the model state a rank holds with ep is
the engine's own count, the all-to-all's bytes and time, ep in the layout and the search, the
refusals, and the published MoE rows with their sources."""
import pytest

from hpcpar.data_parallel.zero_memory import TERMS, formula
from hpcpar.nn.gpt import PRESETS, preset
from hpcpar.tools.plan import experts
from hpcpar.tools.plan.hardware import load_hardware
from hpcpar.tools.plan.job import Engine, Job
from hpcpar.tools.plan.layout import Layout, parse_layout
from hpcpar.tools.plan.measured import planner_view
from hpcpar.tools.plan.activations import layer_activation_bytes, layer_activation_terms
from hpcpar.tools.plan.memory import stage_memory
from hpcpar.tools.plan.models import load_model
from hpcpar.tools.plan.network import ep_all_to_all_seconds
from hpcpar.tools.plan.published import RUNS
from hpcpar.tools.plan.search import Space, candidates
from hpcpar.training.config import TrainConfig, check


def mixtral_job(gpus=64, **engine):
    hw = load_hardware("h100")
    return Job(load_model("mixtral-8x7b"), hw, gpus, 8, 256, 4096, engine=Engine(flash_attention=True, **engine))


# (model, world, options): the engine's MoE runs with expert parallelism, ZeRO 0-3, pipeline stages
EP_RUNS = [("moe-tiny", 2, dict(dp=2, ep=2)), ("moe-tiny", 4, dict(dp=4, ep=2, zero=1)),
           ("moe-tiny", 4, dict(dp=4, ep=4, zero=2)), ("mixtral-tiny", 4, dict(dp=2, cp=2, ep=4, zero=1)),
           ("mixtral-tiny", 8, dict(dp=4, pp=2, ep=2, zero=1, microbatches=2)),
           ("moe-tiny", 4, dict(dp=2, pp=2, ep=2, microbatches=2)), ("moe-tiny", 2, dict(dp=2, zero=3)),
           ("moe-tiny", 4, dict(dp=4, ep=2, zero=3)), ("moe-tiny", 4, dict(dp=4, ep=4, zero=3)),
           ("mixtral-tiny", 8, dict(dp=4, pp=2, ep=2, zero=3, microbatches=2))]


@pytest.mark.parametrize("name, world, options", EP_RUNS, ids=[f"{n}-{o}" for n, _, o in EP_RUNS])
def test_model_state_with_ep_is_the_engines_count(name, world, options):
    """Weights, gradients, optimizer state and ZeRO working set of every stage: the planner's are
    data_parallel/zero_memory.formula's (the count --memory-budget checks and the arrays are held to),
    routed experts E/ep on a rank and sharded over their own group."""
    cfg = preset(name, n_layer=4, vocab_size=PRESETS[name].vocab_size or 32)   # 0: the synthetic language's
    c = check(TrainConfig(model=name, batch_size=8, **options), world)
    job, layout = planner_view(c, cfg)
    assert layout.ep == c.ep
    for s in range(c.pp):
        planned = stage_memory(job, layout, s, 1)
        assert {k: planned.get(k, 0) for k in TERMS} == pytest.approx(formula(c, cfg, s), rel=1e-12), (s, options)


@pytest.mark.parametrize("zero", [1, 3])
def test_the_routing_bias_is_held_whole_as_the_engine_holds_it(zero):
    """DeepSeek-V3's balancing bias (--bias-rate): never gathered under ZeRO-3, whole on every rank -
    the planner's terms are the engine's formula with it too."""
    cfg = preset("moe-tiny", n_layer=4, vocab_size=32, bias_rate=0.01)
    c = check(TrainConfig(model="moe-tiny", batch_size=8, dp=4, ep=2, zero=zero, bias_rate=0.01), 4)
    job, layout = planner_view(c, cfg)
    assert job.model.routing_bias_params() == cfg.n_expert
    planned = stage_memory(job, layout, 0, 1)
    assert {k: planned.get(k, 0) for k in TERMS} == pytest.approx(formula(c, cfg, 0), rel=1e-12)


def test_op_level_selective_recompute_keeps_the_expert_rows():
    """torchtitan's policy (Engine.selective_ops) recomputes dense layers' GEMM outputs; the MoE layer is
    counted whole, so a selective layout never drops the routed rows (an upper bound)."""
    job = mixtral_job(selective_ops=True, numpy_caches=False)
    lay = parse_layout("tp1-pp4-dp16-mb1-v1-1f1b-ep8-rcsel")
    rows = layer_activation_terms(job, lay)["experts (rows, router)"]
    assert rows < layer_activation_bytes(job, lay) < layer_activation_bytes(job, lay.with_(recompute="none"))


def test_ep_shrinks_only_the_routed_experts():
    """ep 8 holds 1/8 of the routed experts (45.10 B of Mixtral's 46.70 B), everything else as at ep 1."""
    job = mixtral_job()
    one, eight = (Layout(1, 4, 16, ep=ep, zero=1) for ep in (1, 8))
    m = job.model
    dense, routed = experts.split_params(m, 11.675e9, 8, one)
    assert routed == 8 * m.routed_params() and dense == pytest.approx(11.675e9 - routed)
    dense8, routed8 = experts.split_params(m, 11.675e9, 8, eight)
    assert (dense8, routed8) == (dense, routed / 8)
    w1, w8 = (stage_memory(job, lay, 1, 1)["weights"] for lay in (one, eight))
    assert w1 - w8 == pytest.approx(7 / 8 * routed * 6)       # 6 bytes a weight: fp32 master + bf16 copy


def test_all_to_all_bytes_and_time():
    """tokens * top_k * h * e bytes a rank; (ep - 1)/ep of them leave it, on NVLink inside a node, through
    the rank's port once the group spans nodes."""
    job = mixtral_job()
    hw = job.hardware
    inside = Layout(1, 4, 16, ep=8)
    n = experts.dispatch_bytes(job.model, inside, 4096, 2)
    assert n == 4096 * 2 * 4096 * 2
    want = 7 * hw.intra.latency + 7 / 8 * n / (hw.intra.bandwidth * hw.intra.efficiency)
    assert ep_all_to_all_seconds(job, inside, n) == pytest.approx(want)
    across = Layout(2, 2, 16, sp=True, ep=8)        # tp 2: the 8 members are 2 apart, 4 on a node
    want = 7 * hw.inter.latency + max(3 / 8 * n / (hw.intra.bandwidth * hw.intra.efficiency),
                                      4 / 8 * n / (hw.inter.bandwidth * hw.inter.efficiency))
    assert ep_all_to_all_seconds(job, across, n) == pytest.approx(want)
    assert ep_all_to_all_seconds(job, Layout(1, 4, 16), n) == 0.0
    # sequence parallelism: each TP rank routes its 1/tp of the tokens
    assert experts.dispatch_bytes(job.model, across, 4096, 2) == n / 2
    t = experts.all_to_all_times(job, inside, 4096)
    assert t == {"fwd EP all-to-all": 2 * ep_all_to_all_seconds(job, inside, n), "bwd EP all-to-all": t["fwd EP all-to-all"]}


def test_ep_in_the_layout_string_and_the_search():
    lay = parse_layout("tp1-pp4-dp16-mb1-v1-1f1b-ep8-z1")
    assert lay.ep == 8 and str(lay) == "tp1-pp4-dp16-mb1-v1-1f1b-ep8-z1"
    job = mixtral_job(gpus=16)
    space = Space(schedules=("1f1b",), recompute=("none",), zero=(1,), micro_batch_sizes=(1,), fixed=(("tp", 1),))
    found = {(lay.dp, lay.ep) for lay in candidates(job, space)}
    assert found == {(16, 1), (16, 2), (16, 4), (16, 8), (8, 1), (8, 2), (8, 4), (8, 8), (4, 1), (4, 2), (4, 4),
                     (2, 1), (2, 2)}                # dp 1: ZeRO-1 needs dp * cp > 1
    pinned = Space(schedules=("1f1b",), recompute=("none",), zero=(1,), micro_batch_sizes=(1,),
                   fixed=(("tp", 1), ("ep", 4)))
    assert {lay.ep for lay in candidates(job, pinned)} == {4}
    dense = Job(load_model("llama3-8b"), job.hardware, 16, 8, 256, 4096)
    assert {lay.ep for lay in candidates(dense, space)} == {1}


@pytest.mark.parametrize("layout, reason", [
    ("tp1-pp4-dp16-ep3", "ep=3 does not divide dp*cp = 16"),
    ("tp1-pp8-dp8-ep16", "ep=16 does not divide dp*cp = 8"),
    ("tp1-pp1-dp64-ep16", "ep=16 does not divide the 8 experts"),
    ("tp2-pp4-dp8-ep8", "needs sequence parallelism"),
])
def test_refusals(layout, reason):
    assert reason in mixtral_job().check(parse_layout(layout))


def test_ep_without_experts_is_refused():
    job = Job(load_model("llama3-8b"), load_hardware("h100"), 16, 8, 256, 4096)
    assert job.check(Layout(1, 1, 16, ep=2)) == "ep=2 needs a model with experts"


def test_total_and_active_parameters():
    """Mixtral 8x7B: 46.7 B parameters, 12.9 B active (Jiang et al. 2024: 47 B, 13 B)."""
    m = load_model("mixtral-8x7b")
    assert round(m.params(4096) / 1e9, 2) == 46.70 and round(m.active_params(4096) / 1e9, 2) == 12.88
    dense = load_model("llama3-8b")
    assert dense.active_params(8192) == dense.params(8192)


def test_published_moe_rows_load_with_their_sources():
    moe = [r for r in RUNS if load_model(r.model).experts]
    assert moe, "no published run of a model with experts"
    for r in moe:
        assert r.role == "validation" and r.url.startswith("https://") and r.source and r.ep > 1
        assert r.gpus == r.tp * r.cp * r.pp * r.dp and (r.dp * r.cp) % r.ep == 0
        assert r.tflops_per_gpu or r.step_seconds or r.tokens_per_gpu


def test_a_step_counts_the_all_to_alls_and_explains_them():
    """The all-to-alls are in F and B and in the communication share; --explain shows total against
    active and the all-to-all's formula."""
    from hpcpar.tools.plan.explain import explain
    from hpcpar.tools.plan.step import estimate
    job = mixtral_job()
    with_ep, without = (estimate(job, Layout(1, 4, 16, zero=1, ep=ep), simulate=False) for ep in (8, 1))
    layers = job.stage_layers(with_ep.layout)[0]
    a2a = experts.all_to_all_times(job, with_ep.layout, 4096)
    assert with_ep.stages[0].terms["fwd EP all-to-all"] == pytest.approx(layers * a2a["fwd EP all-to-all"])
    assert "fwd EP all-to-all" not in without.stages[0].terms
    assert with_ep.memory_peak < without.memory_peak       # 1/8 of the experts' state
    text = explain(with_ep)
    assert "12.88 B of 46.70 B parameters" in text and "EP all-to-all of tokens * top_k * h = 64.0 MiB" in text


def test_expert_gradients_travel_over_their_own_group():
    """Summed over the (dp * cp) / ep ranks holding the same experts; nowhere when each lives on one rank."""
    from hpcpar.tools.plan.network import expert_data_seconds, group_link, reduce_scatter_seconds
    job = mixtral_job()
    lay = Layout(1, 4, 16, ep=8)
    nbytes = 1e9 * 4
    link = group_link(job.hardware, lay, "expert-data", 8)       # 2 ranks 8 apart: across nodes
    assert link.latency == job.hardware.inter.latency
    assert experts.gradient_seconds(job, lay, 1e9, 4) == (reduce_scatter_seconds(link, 2, nbytes),) * 2
    assert expert_data_seconds(job, lay, nbytes) == reduce_scatter_seconds(link, 2, nbytes)
    assert experts.gradient_seconds(job, Layout(1, 8, 8, ep=8), 1e9, 4) == (0.0, 0.0)


def test_local_prediction_refuses_experts_and_says_why():
    from hpcpar.tools.plan.local import predict_local
    from hpcpar.runtime import UsageError
    with pytest.raises(UsageError, match="fitted without any"):
        predict_local("local.toml", model="moe-tiny")
