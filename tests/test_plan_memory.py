"""Memory per GPU (hpcpar/tools/plan/memory.py) against the formulas of docs/design.md (Memory), term by term;
the check against hpcpar's own measured peak is test_plan_measured_memory.py."""
import pytest

from hpcpar.tools.plan.hardware import load_hardware
from hpcpar.tools.plan.job import Engine, Job
from hpcpar.tools.plan.layout import Layout, stage_layers
from hpcpar.tools.plan.activations import layer_activation_bytes, layer_activation_terms
from hpcpar.tools.plan.memory import (analytic_inflight, comm_buffer_bytes, stage_memory, stage_params,
                                      state_bytes_per_param, workspace_bytes)
from hpcpar.tools.plan.models import load_model, parse_dims

GPT = parse_dims("l=24,h=2048,a=16,V=51200,dropout=1")
MEGATRON = Engine(numpy_caches=False, adam_buffers=2)   # the tensors Korthikanti et al. count; Adam m, v


def job(model=GPT, gpus=8, seq=2048, batch=64, dtype="bf16", engine=MEGATRON):
    return Job(model, load_hardware("a100"), gpus, 8, batch, seq, dtype, engine)


@pytest.mark.parametrize("tp, sp", [(1, False), (2, False), (4, False), (8, False), (4, True), (8, True)])
def test_activations_are_korthikanti(tp, sp):
    j, b, s, h, a = job(), 2, 2048, GPT.hidden, GPT.heads
    lay = Layout(tp, 1, 8 // tp, mb=b, sp=sp)
    sbh = s * b * h
    if sp:
        expected = sbh * (34 + 5 * a * s / h) / tp
    else:
        expected = sbh * (10 + 24 / tp + 5 * a * s / (h * tp))
    assert layer_activation_bytes(j, lay) == pytest.approx(expected)


def test_recomputation_keeps_less():
    j, lay = job(), Layout(2, 1, 4, mb=1)
    s, a = 2048, GPT.heads
    none = layer_activation_bytes(j, lay)
    sel = layer_activation_bytes(j, lay.with_(recompute="selective"))
    full = layer_activation_bytes(j, lay.with_(recompute="full"))
    assert none - sel == pytest.approx(5 * a * s * s / 2)            # the scores, per TP rank
    assert full == 2 * s * GPT.hidden                                # the layer input, 16-bit
    assert layer_activation_terms(j, lay)["attention scores"] > 0
    flash = job(engine=Engine(flash_attention=True, numpy_caches=False, adam_buffers=2))
    assert layer_activation_terms(flash, lay)["attention scores"] < none / 100


def test_model_state_bytes_and_zero_stages():
    j = job()
    # precision.py keeps a bf16 compute copy, fp32 gradients, fp32 master weights, Adam m and v
    assert sum(state_bytes_per_param(j)) == 18                       # 2 + 4 + (4 + 8)
    assert sum(state_bytes_per_param(job(engine=Engine()))) == 18    # hpcpar's Adam: no scratch array
    # hpcpar keeps its fp32 masters whole until ZeRO-3 (replicas.py), and ZeRO-1 reduce-scatters into
    # a gradient slice of its own
    assert state_bytes_per_param(j, zero=1, shard=4) == (2 + 4, 4 + 1, 8 / 4)
    assert state_bytes_per_param(j, zero=2, shard=4) == (2 + 4, 1, 2)
    assert state_bytes_per_param(j, zero=3, shard=4) == (1, 1, 2)
    # Megatron's distributed optimizer shards its fp32 main weights with the Adam state
    megatron = job(engine=Engine(numpy_caches=False, mixed_state_bytes=(2, 4, 12), shard_grad_buffer=False))
    assert state_bytes_per_param(megatron, zero=1, shard=4) == (2, 4, 3)
    assert state_bytes_per_param(megatron, zero=3, shard=4) == (0.5, 1, 3)
    assert sum(state_bytes_per_param(job(dtype="fp64"))) == 32       # 8 + 8 + 16 (Adam m, v)
    assert sum(state_bytes_per_param(job(dtype="fp32", engine=Engine()))) == 16   # 4 + 4 + 8 (Adam m, v)
    lay, z = Layout(1, 1, 8), Layout(1, 1, 8, zero=1)
    assert stage_memory(j, z, 0, 1)["optimizer state"] == stage_memory(j, lay, 0, 1)["optimizer state"] / 8


def test_zero_shards_over_dp_times_cp():
    lay = Layout(1, 1, 4, zero=1, cp=2)
    assert lay.shard == 8 and lay.gpus == 8
    assert stage_memory(job(), lay, 0, 1)["optimizer state"] == pytest.approx(stage_params(job(), lay, 0) * 8 / 8)  # fp32 m, v


def test_fsdp_keeps_two_whole_units_and_two_gradients():
    j, lay = job(engine=Engine(numpy_caches=False, adam_buffers=2, fsdp_reduce_once=False)), Layout(1, 1, 8, zero=3)
    terms = stage_memory(j, lay, 0, 1)
    unit = max(GPT.layer_params(), GPT.vocab * GPT.hidden)
    # in use and prefetched (bf16), the gradient being computed and the one being reduce-scattered (fp32)
    assert terms["ZeRO working set"] == pytest.approx(unit * (2 * 2 + 2 * 4))
    assert terms["weights"] == pytest.approx(stage_params(j, lay, 0) * 4 / 8)   # the fp32 master slices
    once = job(engine=Engine(numpy_caches=False, adam_buffers=2, fsdp_gather_once_with_pp=True))
    piped = Layout(1, 2, 4, zero=3)
    assert stage_memory(once, piped, 1, 1)["ZeRO working set"] == pytest.approx(stage_params(once, piped, 1) * (2 + 4))
    # hpcpar reduce-scatters a unit once a step: over 8 micro-batches its whole stage's gradient accumulates
    accumulating = job(engine=Engine(numpy_caches=False, adam_buffers=2))
    assert stage_memory(accumulating, lay, 0, 1)["ZeRO working set"] == \
        pytest.approx(unit * 2 * 2 + stage_params(j, lay, 0) * 4)


def test_zero2_holds_the_full_gradient_in_the_backward():
    j = job(dtype="fp32", engine=Engine())
    params = stage_params(j, Layout(1, 1, 8), 0)
    terms = stage_memory(j, Layout(1, 1, 8, zero=2), 0, 1)
    assert terms["gradients"] == pytest.approx(params * 4 / 8)
    assert terms["ZeRO working set"] == pytest.approx(params * 4)
    assert "ZeRO working set" not in stage_memory(j, Layout(1, 1, 8, zero=1), 0, 1)


def test_context_parallelism_divides_the_sequence():
    j = job(engine=Engine(flash_attention=True, numpy_caches=False, adam_buffers=2))
    one, four = Layout(2, 1, 4, sp=True), Layout(2, 1, 1, sp=True, cp=4)
    assert layer_activation_bytes(j, four) == pytest.approx(layer_activation_bytes(j, one) / 4)
    # ring attention: two K/V chunks of s/cp tokens in flight, on top of the SP all-gather buffer
    sbh = 2048 // 4 * GPT.hidden * 2
    assert comm_buffer_bytes(j, four) == pytest.approx(sbh + 2 * 2 * 2048 // 4 * GPT.hidden // 2 * 2)


def test_buffers_workspace_and_allocator_cache_are_terms():
    j, lay = job(), Layout(2, 2, 2, sp=True)
    terms = stage_memory(j, lay, 0, 2)
    assert terms["communication buffers"] == comm_buffer_bytes(j, lay) > 0
    assert terms["workspace"] == workspace_bytes(j, lay) > 0
    assert "allocator cache" not in terms
    fragmented = job(engine=Engine(numpy_caches=False, allocator_cache=0.1))
    t = stage_memory(fragmented, lay, 0, 2)
    dynamic = sum(v for k, v in t.items() if k not in ("weights", "gradients", "optimizer state",
                                                      "allocator cache"))
    assert t["allocator cache"] == pytest.approx(0.1 * dynamic)


def test_gpt3_cannot_fit_one_device():
    """Why split a model at all: 175 B parameters x 16 bytes is ~2.6 TiB of model state, 35x an 80 GB GPU."""
    m = load_model("gpt3-175b")
    state = m.params(2048) * sum(state_bytes_per_param(job(m)))
    assert state / load_hardware("a100").memory_bytes > 30


def test_stages_hold_their_layers_and_the_ends():
    j = job(gpus=8)
    lay = Layout(1, 4, 2)
    counts = stage_layers(GPT.layers, 4)
    body = [stage_params(j, lay, i) for i in range(4)]
    assert body[1] == counts[1] * GPT.layer_params()
    assert body[0] - counts[0] * GPT.layer_params() == GPT.embedding_params(2048)
    # the last stage holds the tied embedding's copy for the head, plus the final LayerNorm
    assert body[3] - counts[3] * GPT.layer_params() == GPT.vocab * GPT.hidden + 2 * GPT.hidden
    assert sum(stage_layers(70, 12)) == 70 and stage_layers(70, 12)[0] == 5   # BLOOM's 5 + 6*10 + 5


def test_inflight_per_schedule():
    assert [analytic_inflight("1f1b", 4, 8, 1, i) for i in range(4)] == [4, 3, 2, 1]
    assert analytic_inflight("gpipe", 4, 8, 1, 0) == 8
    # Megatron's interleaved warm-up: 2 (p - 1) + (v - 1) p + 1 chunks on the first stage
    assert analytic_inflight("interleaved", 4, 8, 2, 0) == 2 * 3 + 4 + 1
    assert analytic_inflight("1f1b", 4, 2, 1, 0) == 2
    # until W where the backward is split: ZB-H1 p, ZB-H2 2p - 1 on every rank; ZB-V 2p, DualPipeV 2p + 1 chunks
    assert [analytic_inflight("zb-h1", 4, 8, 1, i) for i in range(4)] == [4] * 4
    assert [analytic_inflight("zb-h2", 4, 8, 1, i) for i in range(4)] == [7] * 4
    assert [analytic_inflight("zb-v", 4, 4, 2, i) for i in range(4)] == [5, 6, 7, 8]
    assert analytic_inflight("dualpipev", 4, 8, 2, 0) == 9


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipev"])
def test_a_v_puts_both_ends_on_rank_0(schedule):
    """Under a V rank 0 holds virtual stages 0 and 2p-1: the embedding, the head (the tied embedding
    itself, no copy), the logits; the last rank holds the V's point, two middle stages, and no end."""
    j, lay = job(gpus=8, batch=64), Layout(1, 4, 2, v=2, schedule=schedule)
    assert j.ends(lay) == (0, 0) and j.stage_layers(lay) == (6, 6, 6, 6)
    params = [stage_params(j, lay, i) for i in range(4)]
    assert params[0] - 6 * GPT.layer_params() == GPT.embedding_params(2048) + 2 * GPT.hidden   # + final norm
    assert params[1:] == [6 * GPT.layer_params()] * 3
    terms = [stage_memory(j, lay, i, analytic_inflight(schedule, 4, 8, 2, i)) for i in range(4)]
    assert "head and logits" in terms[0] and "embedding dropout" in terms[0]
    assert not any("head and logits" in t or "embedding dropout" in t for t in terms[1:])


def test_zb_v_holds_1f1b_rank_0s_activations_on_every_rank():
    """ZB-V: 2p chunk-forwards of half a stage on every rank, the bytes 1F1B's rank 0 holds (Qi et al. 2024,
    section 6); ZB-H2 2p - 1 whole stages on every rank until W."""
    j = job(gpus=8, batch=64)
    flat = lambda lay, i, n: stage_memory(j, lay, i, n)["activations"]
    one_f_one_b = flat(Layout(1, 4, 2), 0, analytic_inflight("1f1b", 4, 32, 1, 0))
    zbv = Layout(1, 4, 2, v=2, schedule="zb-v")
    assert [flat(zbv, i, analytic_inflight("zb-v", 4, 32, 2, i)) for i in range(4)] == [one_f_one_b] * 4
    assert [analytic_inflight("zb-h2", 4, 32, 1, i) for i in range(4)] == [7] * 4


def test_op_level_selective_recompute_keeps_input_attention_and_half_the_gemm_outputs():
    """torchtitan's policy: less than the whole set, more than full recomputation's layer input."""
    ops = job(engine=Engine(flash_attention=True, numpy_caches=False, adam_buffers=2, selective_ops=True))
    lay = Layout(1, 1, 8, recompute="selective")
    kept = layer_activation_bytes(ops, lay)
    assert layer_activation_bytes(ops, lay.with_(recompute="full")) < kept
    assert kept < layer_activation_bytes(ops, lay.with_(recompute="none")) / 2


def test_op_level_selective_keeps_a_ranks_own_keys_and_values_once():
    """Under tensor parallelism a rank's K and V outputs are its kv_heads_per_rank heads (already per
    rank, replicated once tp exceeds them): two more K/V heads on a rank keep half their outputs more."""
    engine = Engine(flash_attention=True, numpy_caches=False, adam_buffers=2, selective_ops=True)
    lay = Layout(4, 1, 2, recompute="selective", sp=True)
    kv4, kv8 = (job(parse_dims(f"l=24,h=2048,a=16,kv={kv},V=51200"), engine=engine) for kv in (4, 8))
    tokens, elem, d = 2048 * lay.mb, 2, 2048 // 16
    more = layer_activation_bytes(kv8, lay) - layer_activation_bytes(kv4, lay)   # 2 against 1 K/V head a rank
    assert more == pytest.approx(tokens * elem * 2 * (2 - 1) * d / 2)


def test_the_loss_keeps_one_micro_batchs_logits_at_the_engines_bytes():
    eager = job(engine=Engine(numpy_caches=False, loss_bytes_per_logit=10))
    lay = Layout(1, 4, 2, v=2, schedule="interleaved")
    logits = 2048 * GPT.vocab
    head = stage_memory(eager, lay, 3, 5)["head and logits"]
    assert head == pytest.approx(10 * logits + 2 * 2048 * GPT.hidden * 2)       # one micro-batch, not 5
    gpipe = stage_memory(eager, lay.with_(schedule="gpipe", v=1), 3, 5)["head and logits"]
    assert gpipe == pytest.approx(5 * head)                                      # every forward first


def test_the_allocator_cache_is_reported_but_need_not_fit():
    """PyTorch reports its peak reserved memory; on a failed allocation it releases the cache first."""
    from hpcpar.tools.plan.step import estimate
    cached = job(engine=Engine(flash_attention=True, numpy_caches=False, allocator_cache=100.0))
    est = estimate(cached, Layout(1, 1, 8, zero=3))
    assert est.memory_peak > cached.hardware.usable_bytes and est.fits


def test_an_llm_foundry_job_keeps_its_logits_at_the_fused_loss_2_bytes():
    """llm-foundry's fused cross-entropy keeps only the 16-bit logits (published.FUSED_LOSS).  One
    published job, MPT-760M at 2,048 tokens, micro-batch 24, FSDP on 8 GPUs, is pinned: its loss term
    and its peak, so a change to either the loss term or llm-foundry's framework entry shows here.  At
    the 10 bytes per logit of an eager cross_entropy(logits.float()) the same job would not fit."""
    from dataclasses import replace
    from hpcpar.tools.plan.published import EAGER_LOSS, RUNS
    from hpcpar.tools.plan.validate import predict
    run = next(r for r in RUNS if r.name == "MPT-760M, 2048 tokens, 8 GPUs")
    est = predict(run)
    assert str(est.layout) == "tp1-pp1-dp8-mb24-v1-1f1b-z3"
    tokens, vocab, hidden = 24 * 2048, 50368, 1536
    head = est.memory[0]["head and logits"]
    assert head == 2 * tokens * vocab + 2 * tokens * hidden * 2          # logits, final norm and head inputs
    # the whole peak as the model counts it today (69.9 GiB, allocator cache included): the same
    # arithmetic on the same numbers, so only a change to the model moves it (the last move: ZeRO-3's
    # second unsharded gradient, the one being reduce-scattered, and the allocator share refitted with it)
    assert est.memory_peak == pytest.approx(75_034_617_372.672, rel=1e-9) and est.fits
    eager = predict(run, engine=replace(run.features["engine"], **EAGER_LOSS))
    assert eager.memory[0]["head and logits"] - head == 8 * tokens * vocab and not eager.fits
