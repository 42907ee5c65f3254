"""Time of one micro-batch through one pipeline stage: forward F, input-gradient B, weight-gradient W.

Three kinds of work, each from its own rate:

* GEMMs (flops.py): a GEMM of F FLOPs runs at the hardware's sustained rate for its size class, or at
  the speed HBM can feed it if that is slower:  t = max(F / rate(F), bytes / HBM bandwidth).
* memory-bound element-wise passes (LayerNorm, bias + activation, dropout, residual adds, softmax):
  bytes read + written / HBM bandwidth.  Forward, per layer and micro-batch:
      2*sbh (each norm) ... 2 norms, 2 (bias, dropout, residual) passes of 3*sbh + masks,
      2*sbf/t (activation; 3 for gated), 2 + 3 (softmax, dropout) * a*s*s*b/t (not with flash attention)
  and backward about twice that.
* tensor-parallel collectives (network.py): 2 all-reduces of b*s*h forward and 2 backward per layer
  (with sequence parallelism an all-gather + reduce-scatter pair each: the same ring time).  hpcpar's
  engine does not overlap them with compute, so they add; an engine that does (``overlap_tp``: the
  collective split into chunks pipelined with the GEMM that consumes or produces it) hides each of
  the four all-gathers / reduce-scatters of a pass under its own GEMM only (QKV, attention output,
  MLP up, MLP down; twice those GEMMs backward): what is longer than its GEMM shows.
* context parallelism (ring attention): each of the cp ranks sends its K and V chunk around the ring,
  cp - 1 hops of 2*kv*d*(s/cp)*b elements per layer forward, twice that backward (K, V and their
  gradients), overlapped with the attention core: only the part longer than the core shows.  An
  engine that all-gathers K and V instead (``engine.cp_allgather``, Llama 3's) waits for the gather
  before the core: one all-gather forward, and backward an all-gather of K, V and a reduce-scatter of
  dK, dV, all exposed.
* expert parallelism (tools/plan/experts.py): each MoE layer's dispatch and combine all-to-alls, forward and
  backward, exposed (hpcpar's engine waits for each) - or, where the engine pairs one micro-batch's
  forward with another's backward (DeepSeek's DualPipe, ``Engine.overlap_ep``), under the other's GEMMs.
* fp8 (``engine.fp8``): the linear layers' GEMMs at the fp8 peak rate x ``engine.fp8_efficiency`` (the
  engine's dynamic-scaling casts around each fp8 GEMM and its kernels' sustained share); the attention
  core stays 16-bit.
* an engine whose kernels are slower than the fused ones the hardware's factor was fitted to (eager
  PyTorch: one kernel per operation, launch gaps) runs every GEMM at ``engine.gemm_efficiency`` of the rate,
  or, in a layout that recomputes nothing, at ``engine.gemm_efficiency_no_recompute`` where the engine
  has one (eager Composer sustains less without activation checkpointing: published.COMPOSER_EAGER).

Recomputation adds to B: the whole forward of every layer (full) or the attention core (selective);
PyTorch's op-level selective policy: every second linear GEMM and the element-wise passes.
"""
from dataclasses import dataclass, field, replace

from hpcpar.tools.plan import experts
from hpcpar.tools.plan.flops import layer_gemms, logits_gemm
from hpcpar.tools.plan.activations import tokens_per_rank
from hpcpar.tools.plan.network import cp_all_to_all_seconds, cp_allgather_seconds, cp_ring_seconds, tp_all_reduce


@dataclass
class StageTimes:
    forward: float          # F: seconds per micro-batch on this stage
    backward: float         # B: input gradients (plus any recomputation)
    weight: float           # W: weight gradients
    terms: dict = field(default_factory=dict)   # the parts, for --explain


def layout_engine_job(job, layout):
    """``job`` with the GEMM efficiency its engine sustains in ``layout``: the no-recompute one where the
    engine has one and the layout recomputes nothing."""
    no_recompute = job.engine.gemm_efficiency_no_recompute
    if layout.recompute != "none" or no_recompute is None:
        return job
    return replace(job, engine=replace(job.engine, gemm_efficiency=no_recompute))


def gemm_rate(job, gemm):
    """FLOP/s of one GEMM on this engine: fp8 for the linear layers' GEMMs where the engine runs them so."""
    fp8 = job.engine.fp8 and gemm.weight
    # the size class of a batched GEMM is its whole size, as in Calculon (one kernel launch)
    rate = job.hardware.gemm_rate(gemm.flops, "fp8" if fp8 else job.dtype) * job.engine.gemm_efficiency
    return rate * job.engine.fp8_efficiency if fp8 else rate


def gemm_seconds(job, gemm):
    compute = gemm.flops / gemm_rate(job, gemm) if gemm.flops else 0.0
    return max(compute, job.hardware.memory_seconds(gemm.elements * job.elem_bytes))


def exposed(comm, under):
    """The part of ``comm`` seconds that ``under`` seconds of compute running alongside cannot hide."""
    return max(comm - under, 0.0)


def elementwise_bytes(job, layout):
    """HBM bytes read + written by one layer's element-wise forward passes, per micro-batch."""
    m, t, e = job.model, layout.tp, job.elem_bytes
    sb = tokens_per_rank(job, layout)
    mask = 1 if m.dropout else 0
    norms_and_residuals = sb * m.hidden * (2 * 2 * e + 2 * (3 * e + mask)) / (t if layout.sp else 1)
    activation = sb * m.ffn / t * (3 if m.gated else 2) * e
    scores = 0.0
    if not job.engine.flash_attention:
        scores = (m.heads // t) * sb * job.attended * (2 * e + (2 * e + mask if m.dropout else 0))
    passes = {"norms, residuals": norms_and_residuals, "activation": activation, "softmax, dropout": scores}
    return dict(passes, **experts.elementwise_bytes(m, layout, sb, e)) if m.experts else passes


def layer_key(layout):
    """What of a layout one layer's times (``layer_times``) and a stage's ends (``end_times``) depend
    on: a search meets each of these many times, beside every pipeline, data-parallel size, schedule
    and ZeRO stage (tests/test_plan_search.py holds the two functions to it)."""
    return layout.tp, layout.cp, layout.cp_kind, layout.mb, layout.sp, layout.recompute, layout.ep


def layer_times(job, layout):
    """Seconds of one layer for one micro-batch, by term."""
    job = layout_engine_job(job, layout)
    gemms = layer_gemms(job.model, layout.mb, job.seq_len, layout.tp, layout.cp, job.attended)
    hw = job.hardware
    sbh_bytes = tokens_per_rank(job, layout) * job.model.hidden * job.elem_bytes
    elem = elementwise_bytes(job, layout)
    linear = sum(gemm_seconds(job, g) for g in gemms if g.weight)
    core = sum(gemm_seconds(job, g) for g in gemms if not g.weight)
    tp_pass = 2 * tp_all_reduce(job, layout, sbh_bytes)
    tp_fwd = tp_bwd = tp_pass
    if job.engine.overlap_tp:   # each of the 4 half-collectives hides under its own GEMM only
        quarter = tp_pass / 4
        tp_fwd = sum(exposed(quarter, gemm_seconds(job, g)) for g in gemms if g.weight)
        tp_bwd = sum(exposed(quarter, 2 * gemm_seconds(job, g)) for g in gemms if g.weight)
    t = {
        "fwd GEMM": linear + core,
        "fwd element-wise": hw.memory_seconds(sum(elem.values())),
        "fwd TP all-reduce": tp_fwd,
        # backward: every GEMM twice (dX and dW); the attention core's two are both dX work
        "bwd GEMM dX": linear + 2 * core,
        "bwd GEMM dW": linear,
        "bwd element-wise": 2 * hw.memory_seconds(sum(elem.values())),
        "bwd TP all-reduce": tp_bwd,
    }
    t.update(cp_times(job, layout, core))
    ep = experts.all_to_all_times(job, layout, tokens_per_rank(job, layout))
    if ep and job.engine.overlap_ep:      # the forward's under the paired backward's GEMMs, and back
        ep = {"fwd EP all-to-all": exposed(ep["fwd EP all-to-all"], t["bwd GEMM dX"] + t["bwd GEMM dW"]),
              "bwd EP all-to-all": exposed(ep["bwd EP all-to-all"], t["fwd GEMM"])}
    t.update(ep)
    if layout.recompute == "full":
        t["recompute forward"] = sum(v for k, v in t.items() if k.startswith("fwd "))
    elif layout.recompute == "selective" and job.engine.selective_ops:   # every second linear GEMM
        t["recompute ops"] = linear / 2 + t["fwd element-wise"]               # and the element-wise passes
    elif layout.recompute == "selective" and not job.engine.flash_attention:
        t["recompute attention"] = core + hw.memory_seconds(elem["softmax, dropout"])
    return t


def cp_times(job, layout, core):
    """Exposed context-parallel communication of one layer, forward and backward ({} without cp)."""
    if layout.cp == 1:
        return {}
    if layout.cp_kind == "ulysses":                      # blocking, before and after the core, both ways
        a2a = cp_all_to_all_seconds(job, layout)
        return {"fwd CP all-to-all": a2a, "bwd CP all-to-all": a2a}
    if job.engine.cp_allgather:
        gather = cp_allgather_seconds(job, layout)
        return {"fwd CP all-gather": gather, "bwd CP all-gather": 2 * gather}
    ring = cp_ring_seconds(job, layout)                  # cp - 1 hops of a K and V chunk
    # Backward, K and V go round again (cp - 1 hops) beside the partial sums of dK and dV, which go
    # round the whole ring (cp hops): the last brings each rank its own dK, dV after the last block,
    # with no compute left to hide it - 3cp - 2 hops a layer in all, as the engine sends them.
    return {"fwd CP ring": exposed(ring, core),
            "bwd CP ring": exposed(2 * ring, 2 * core) + ring / (layout.cp - 1)}


def end_times(job, layout, first, last):
    """Extra work of the first stage (embedding) and the last (norm, logits, cross-entropy)."""
    job = layout_engine_job(job, layout)
    m, hw, e = job.model, job.hardware, job.elem_bytes
    sb = tokens_per_rank(job, layout)
    sbh_bytes = sb * m.hidden * e
    extra = {}
    if first:   # token + position gather and the vocab-parallel embedding's all-reduce
        extra["embedding"] = (hw.memory_seconds(3 * sbh_bytes) + tp_all_reduce(job, layout, sbh_bytes),
                              hw.memory_seconds(2 * sbh_bytes), 0.0)
    if last:    # logits GEMM, fp32 softmax cross-entropy over V/t, 3 small all-reduces (max, sum, target)
        g = logits_gemm(m, layout.mb, job.seq_len, layout.tp, layout.cp)
        logits = sb * m.vocab / layout.tp * 4
        small = 3 * tp_all_reduce(job, layout, sb * 4)
        extra["head"] = (gemm_seconds(job, g) + hw.memory_seconds(3 * logits + 2 * sbh_bytes) + small,
                         gemm_seconds(job, g) + hw.memory_seconds(2 * logits + 2 * sbh_bytes)
                         + tp_all_reduce(job, layout, sbh_bytes),
                         gemm_seconds(job, g))
    return extra


def stage_times(job, layout, stage, lt=None):
    """F, B and W of one micro-batch through every layer of ``stage`` (all its chunks);
    ``lt``: the layer's times when already computed (they are the same on every stage)."""
    n = job.stage_layers(layout)[stage]
    lt = lt or layer_times(job, layout)
    recompute = sum(v for k, v in lt.items() if k.startswith("recompute"))
    f = n * sum(v for k, v in lt.items() if k.startswith("fwd "))
    b = n * (sum(v for k, v in lt.items() if k.startswith("bwd ") and k != "bwd GEMM dW") + recompute)
    w = n * lt["bwd GEMM dW"]
    terms = {k: n * v for k, v in lt.items()}
    first, last = job.ends(layout)
    for name, (ef, eb, ew) in end_times(job, layout, stage == first, stage == last).items():
        f, b, w = f + ef, b + eb, w + ew
        terms[name] = ef + eb + ew
    return StageTimes(f, b, w, terms)


def tp_comm_seconds(times):
    """The exposed tensor-, context- and expert-parallel communication inside a stage's F + B (for the
    communication share)."""
    return sum(v for k, v in times.terms.items() if "TP" in k or "CP" in k or "EP" in k)
