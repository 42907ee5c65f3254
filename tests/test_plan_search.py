"""Layouts, the step model and the search (layout.py, job.py, step.py, search.py)."""
import time

import pytest

from hpcpar.tools.plan.hardware import load_hardware
from hpcpar.tools.plan.job import Job
from hpcpar.tools.plan.layout import Layout, parse_layout
from hpcpar.tools.plan.models import load_model, parse_dims
from hpcpar.tools.plan.search import Space, candidates, search
from hpcpar.tools.plan.step import estimate
from hpcpar.runtime import UsageError


@pytest.mark.parametrize("text", ["tp8-pp8-dp16-mb1-v1-1f1b", "tp4-pp12-dp8-mb2-v1-zb-h1-sp-z1-rcfull",
                                  "tp8-pp16-dp4-mb1-v1-1f1b-cp16-sp-z1", "tp1-pp1-dp8-mb2-v1-1f1b-z3-rcsel",
                                  "tp2-pp4-dp2-mb1-v3-interleaved-rcsel", "tp1-pp2-dp1-mb4-v1-gpipe",
                                  "tp2-pp4-dp2-mb1-v2-zb-v-z1", "tp1-pp8-dp1-mb1-v2-dualpipev-rcsel",
                                  "tp1-pp4-dp2-mb2-v1-zb-h2", "tp1-pp1-dp32-mb1-v1-1f1b-z3-hs8-rcsel"])
def test_layout_strings_round_trip(text):
    assert str(parse_layout(text)) == text


@pytest.mark.parametrize("text", ["tp8-pp8", "tp8-pp8-dp2-foo", "tpx-pp1-dp1"])
def test_bad_layout_strings(text):
    with pytest.raises(UsageError):
        parse_layout(text)


@pytest.mark.parametrize("text", ["tp1-pp4-dp1-mb1-v2-zb-x", "tp1-pp4-dp1-mb1-v1-zb", "tp1-pp4-dp1-h1-zb"])
def test_only_whole_schedule_names_are_read(text):
    """A name that merely starts like a schedule's ("zb-x", "zb" alone) is refused, never read as zb-h1."""
    with pytest.raises(UsageError, match="cannot read"):
        parse_layout(text)


def small_job(gpus=8, batch=32, model="l=8,h=512,a=8,V=1000"):
    return Job(parse_dims(model), load_hardware("a100"), gpus, 8, batch, 512)


def test_check_refuses_what_does_not_divide():
    job = small_job()
    assert job.check(Layout(2, 2, 2, mb=2)) is None
    assert "GPUs" in job.check(Layout(2, 2, 1))
    assert "batch" in job.check(Layout(1, 1, 8, mb=3))
    assert "heads" in small_job(gpus=6, batch=36).check(Layout(3, 1, 2))
    deep = small_job(batch=24, model="l=16,h=512,a=8,V=1000")
    assert deep.check(Layout(1, 8, 1, mb=3, v=2, schedule="interleaved")) is None
    assert "multiple of pp" in deep.check(Layout(1, 8, 1, mb=2, v=2, schedule="interleaved"))
    assert "layers per stage" in deep.check(Layout(1, 8, 1, mb=3, v=3, schedule="interleaved"))
    assert "1f1b needs chunks = 1, got 2" in deep.check(Layout(1, 8, 1, mb=3, v=2))


def test_the_v_schedules_take_the_schedule_modules_sizes():
    """Two chunks per rank exactly, and DualPipeV's 2p micro-batches: the refusals of schedules.build, in
    its words; no multiple of pp needed (that is Megatron's interleaving)."""
    deep = small_job(batch=24, model="l=16,h=512,a=8,V=1000")
    assert deep.check(Layout(1, 8, 1, mb=2, v=2, schedule="zb-v")) is None          # m = 12 on 8 stages
    assert "multiple of pp" in deep.check(Layout(1, 8, 1, mb=2, v=2, schedule="interleaved"))
    assert "exactly 2 chunks per rank as a V, got chunks = 4" in deep.check(Layout(1, 4, 2, mb=3, v=4, schedule="zb-v"))
    assert "needs chunks >= 2" in deep.check(Layout(1, 8, 1, mb=3, v=1, schedule="dualpipev"))
    assert "needs at least 16 micro-batches on 8 stages" in deep.check(Layout(1, 8, 1, mb=2, v=2, schedule="dualpipev"))
    assert deep.check(Layout(1, 8, 1, mb=1, v=2, schedule="dualpipev")) is None
    assert deep.check(Layout(1, 8, 1, mb=1, schedule="zb-h2")) is None
    assert "needs pp >= 2" in deep.check(Layout(8, 1, 1, mb=1, v=2, schedule="zb-v"))


def test_the_search_offers_every_schedule_the_v_ones_with_two_chunks():
    job = small_job(batch=64, model="l=16,h=512,a=8,V=1000")
    chunks = {}
    for lay in candidates(job, Space(fixed=(("tp", 1), ("pp", 4)))):
        chunks.setdefault(lay.schedule, set()).add(lay.v)
    assert chunks["zb-v"] == chunks["dualpipev"] == {2} and chunks["zb-h2"] == {1}
    assert chunks["interleaved"] == {2, 3, 4}         # at most the 4 layers of a stage
    best = search(job, Space(fixed=(("tp", 1), ("pp", 4), ("schedule", "zb-v"))))
    assert best.estimates and all(e.layout.schedule == "zb-v" for e in best.estimates)


def test_step_terms_add_up():
    job = small_job()
    e = estimate(job, Layout(2, 2, 2, mb=2, schedule="1f1b"))
    assert e.step == pytest.approx(e.pipeline.makespan + e.dp_exposed + e.optimizer)
    assert 0 < e.mfu <= e.hfu < 1
    assert 0 <= e.pipeline.bubble < 1 and e.fits


@pytest.mark.parametrize("text", ["tp8-pp16-dp8-mb1-v1-1f1b-sp-z1", "tp8-pp8-dp16-mb1-v6-interleaved-sp-rcsel",
                                  "tp4-pp16-dp16-mb2-v2-zb-v-sp-z1", "tp8-pp12-dp8-mb1-v2-dualpipev-sp-z3-rcfull",
                                  "tp8-pp16-dp8-mb1-v1-gpipe-sp-rcfull", "tp8-pp32-dp4-mb1-v1-zb-h2-sp-z1"])
def test_alike_stages_are_worked_out_once_with_the_same_numbers(text):
    """estimate shares the terms of stages alike in layers, ends and activations in flight (Job.stage_classes):
    every stage's memory, the fullest stage and the optimizer step are what each stage alone gives."""
    from hpcpar.tools.plan.memory import STATE_TERMS, stage_memory
    job = Job(load_model("gpt3-175b"), load_hardware("a100"), 1024, 8, 1536, 2048)
    lay = parse_layout(text)
    for simulate in (False, True):
        e = estimate(job, lay, simulate=simulate)
        assert e.memory == [stage_memory(job, lay, i, e.pipeline.peak_inflight[i]) for i in range(lay.pp)]
        assert len({id(t) for t in e.memory}) == lay.pp          # each stage's own dict
        assert e.optimizer == job.hardware.memory_seconds(2 * max(sum(t[k] for k in STATE_TERMS) for t in e.memory))
    assert len(set(job.stage_classes(lay))) < lay.pp          # there is something to share


def test_a_layer_and_the_ends_depend_on_nothing_but_the_layer_key():
    """The search keeps one layer's times, and a stage's, per compute.layer_key: every layout of a
    mixture of experts' search with cp 1 and 2 (ring, Ulysses), every ep, schedule and ZeRO stage,
    that shares a key has the same times to the bit."""
    from hpcpar.tools.plan.compute import end_times, layer_key, layer_times
    job = h100_job({"flash_attention": True}, model="mixtral-8x7b", batch=256, seq=4096)
    seen = {}
    for lay in candidates(job, Space(cp=(1, 2), micro_batch_sizes=(1, 2))):
        times = layer_times(job, lay), [end_times(job, lay, first, last) for first in (0, 1) for last in (0, 1)]
        assert seen.setdefault(layer_key(lay), times) == times, lay
    assert len(seen) > 20


def test_recompute_costs_time_saves_memory():
    job = small_job()
    base = Layout(2, 2, 2, mb=4)
    plain, full = estimate(job, base), estimate(job, base.with_(recompute="full"))
    assert full.step > plain.step and full.memory_peak < plain.memory_peak


def test_search_ranks_fitting_layouts_fastest_first():
    ranking = search(small_job())
    steps = [e.step for e in ranking.estimates]
    assert steps == sorted(steps) and all(e.fits for e in ranking.estimates)
    assert ranking.considered >= ranking.fitting >= len(ranking.estimates) > 0
    assert all(e.layout.tp in (1, 2, 4, 8) for e in ranking.estimates)


def test_fixed_fields_pin_the_search():
    space = Space(fixed=(("tp", 2), ("pp", 2)))
    assert {lay.grid() for lay in candidates(small_job(), space)} == {(2, 1, 2, 2)}
    pinned = Space(fixed=(("tp", 2), ("zero", 3), ("recompute", "full")))
    layouts = list(candidates(small_job(), pinned))
    assert layouts and all(l.tp == 2 and l.zero == 3 and l.recompute == "full" for l in layouts)


def test_a_gpt3_search_is_fast_and_needs_model_parallelism_or_fsdp():
    """gpt3-175b on 1024 A100s, batch 1536 x 2048: ranked in well under 10 s."""
    job = Job(load_model("gpt3-175b"), load_hardware("a100"), 1024, 8, 1536, 2048)
    start = time.process_time()          # CPU seconds: other jobs on the machine do not count
    ranking = search(job)
    assert time.process_time() - start < 10
    best = ranking.estimates[0]
    # 175 B x 16 bytes does not fit 80 GB GPUs without model parallelism or sharding the state (ZeRO-3)
    assert best.layout.tp * best.layout.pp >= 16 or best.layout.zero == 3
    assert 0.3 < best.mfu < 0.7


H100 = load_hardware("h100")


def h100_job(engine, gpus=64, model="llama3-70b", batch=64, seq=8192):
    from hpcpar.tools.plan.job import Engine
    return Job(load_model(model), H100, gpus, 8, batch, seq, engine=Engine(**engine))


def test_tp_overlap_hides_part_of_the_tp_traffic():
    lay = Layout(8, 1, 8, mb=1, sp=True, zero=3, recompute="full")
    plain, overlapped = estimate(h100_job({}), lay), estimate(h100_job({"overlap_tp": True}), lay)
    tp = lambda e: e.stages[0].terms["fwd TP all-reduce"]
    assert 0 <= tp(overlapped) < tp(plain) and overlapped.step < plain.step


def test_fp8_speeds_up_the_linear_layers_only():
    lay = Layout(8, 1, 8, mb=1, sp=True, zero=3, recompute="full")
    bf16, fp8 = estimate(h100_job({}), lay), estimate(h100_job({"fp8": True}), lay)
    assert fp8.stages[0].terms["fwd GEMM"] < bf16.stages[0].terms["fwd GEMM"]
    assert fp8.step > bf16.step / 2                 # element-wise, attention core and comm stay
    with pytest.raises(UsageError):                 # the A100 has no fp8 rate
        estimate(Job(load_model("llama3-8b"), load_hardware("a100"), 8, 8, 8, 2048,
                     engine=h100_job({"fp8": True}).engine), Layout(1, 1, 8, zero=3))


def test_context_parallelism_ring_and_llama3_layout():
    """Llama 3 405B at TP8 CP16 PP16 on 16,384 GPUs: the CP ring crosses nodes, the layout divides,
    and each rank holds 1/16 of every 131,072-token sequence."""
    job = h100_job({"flash_attention": True}, gpus=16384, model="llama3-405b", batch=128, seq=131072)
    lay = Layout(8, 16, 8, mb=1, v=1, sp=True, zero=1, cp=16)
    assert job.check(lay) is None and lay.gpus == 16384
    est = estimate(job, lay, simulate=False)
    assert est.stages[0].terms["fwd CP ring"] >= 0 and "bwd CP ring" in est.stages[0].terms
    no_cp = estimate(h100_job({"flash_attention": True}, gpus=16384 // 16, model="llama3-405b", batch=8,
                              seq=131072), Layout(8, 16, 8, mb=1, sp=True, zero=1), simulate=False)
    assert est.memory_peak < no_cp.memory_peak


def test_fsdp_traffic_is_per_micro_batch_and_in_the_pipeline():
    job = h100_job({"flash_attention": True}, model="llama3-8b", gpus=8, batch=16)
    est = estimate(job, Layout(1, 1, 8, mb=1, zero=3, recompute="selective"))
    assert est.fsdp[0] > 0 and est.dp_exposed == 0
    assert est.fsdp[1] >= est.fsdp[0] / job.micro_batches(est.layout) * 0      # shown part is never negative


def test_a_no_recompute_gemm_efficiency_applies_only_where_nothing_is_recomputed():
    """An engine with a separate GEMM efficiency for layouts that recompute nothing (published.COMPOSER_EAGER)
    runs those layouts' GEMMs at it, and every other layout's at its usual one; without one, the job
    is unchanged."""
    from dataclasses import replace
    from hpcpar.tools.plan.compute import layer_times, layout_engine_job
    from hpcpar.tools.plan.job import Engine
    job = replace(small_job(), engine=Engine(gemm_efficiency=0.8, gemm_efficiency_no_recompute=0.64))
    none, full = parse_layout("tp1-pp1-dp8-mb4-v1-1f1b"), parse_layout("tp1-pp1-dp8-mb4-v1-1f1b-rcfull")
    assert layout_engine_job(job, none).engine.gemm_efficiency == 0.64
    assert layout_engine_job(job, full) is job
    plain = small_job()
    assert layout_engine_job(plain, none) is plain
    # the GEMMs of this small model are compute-bound: their time goes as 1 / efficiency
    slow, usual = layer_times(job, none)["bwd GEMM dW"], layer_times(job, full)["bwd GEMM dW"]
    assert slow == pytest.approx(usual * 0.8 / 0.64, rel=1e-9)


def test_hsdp_layouts_shard_inside_a_node_and_are_ranked_on_several():
    """HSDP (-hsN): ZeRO over a shard group of N dp ranks (x cp), replicated across the rest.  The search
    tries it on a job of several nodes only, with the shard group filling part of a node; on a network of
    one port per node (1/8 of a DGX's per GPU) keeping the gathers inside the nodes ranks first."""
    from dataclasses import replace
    lay = parse_layout("tp1-pp1-dp32-mb2-v1-1f1b-z3-hs8")
    assert (lay.replicas, lay.shard, lay.across) == (32, 8, 4)
    job = small_job(gpus=32, batch=64)
    assert job.check(lay) is None
    assert "needs ZeRO" in job.check(Layout(1, 1, 32, mb=2, dp_shard=8))
    assert "must divide dp" in job.check(Layout(1, 1, 32, mb=2, zero=1, dp_shard=3))
    assert not any(c.dp_shard for c in candidates(small_job(), Space(zero=(3,))))       # one node: none
    shards = {c.dp_shard for c in candidates(job, Space(zero=(0, 3), fixed=(("pp", 1),)))}
    assert shards == {0, 8, 4, 2}               # tp 1: 8 dp ranks a node, tp 2: 4, tp 4: 2 (tp x dp-shard = 8)
    flat, hsdp = (estimate(job, Layout(1, 1, 32, mb=2, zero=3, dp_shard=s)) for s in (0, 8))
    assert hsdp.fsdp[0] < flat.fsdp[0] and hsdp.dp_total > 0 == flat.dp_total    # gathers inside, sum across
    hw = job.hardware
    slow = replace(job, hardware=replace(hw, inter=replace(hw.inter, bandwidth=hw.inter.bandwidth / 8)))
    best = search(slow, Space(zero=(3,), fixed=(("tp", 1), ("pp", 1)))).estimates[0]
    assert best.layout.dp_shard == 8, best.layout
