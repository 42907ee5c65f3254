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
  (with sequence parallelism an all-gather + reduce-scatter pair each: the same ring time).  The
  engine does not overlap them with compute, so they add.

Recomputation adds to B: the whole forward of every layer (full) or the attention core (selective).
"""
from dataclasses import dataclass, field

from hpcpar.plan.flops import layer_gemms, logits_gemm
from hpcpar.plan.layout import stage_layers
from hpcpar.plan.network import tp_all_reduce


@dataclass
class StageTimes:
    forward: float          # F: seconds per micro-batch on this stage
    backward: float         # B: input gradients (plus any recomputation)
    weight: float           # W: weight gradients
    terms: dict = field(default_factory=dict)   # the parts, for --explain


def gemm_seconds(job, gemm):
    hw = job.hardware
    # the size class of a batched GEMM is its whole size, as in Calculon (one kernel launch)
    compute = gemm.flops / hw.gemm_rate(gemm.flops, job.dtype) if gemm.flops else 0.0
    return max(compute, hw.memory_seconds(gemm.elements * job.elem_bytes))


def elementwise_bytes(job, layout):
    """HBM bytes read + written by one layer's element-wise forward passes, per micro-batch."""
    m, t, e = job.model, layout.tp, job.elem_bytes
    sb = job.seq_len * layout.mb
    mask = 1 if m.dropout else 0
    norms_and_residuals = sb * m.hidden * (2 * 2 * e + 2 * (3 * e + mask)) / (t if layout.sp else 1)
    activation = sb * m.ffn / t * (3 if m.gated else 2) * e
    scores = 0.0
    if not job.engine.flash_attention:
        scores = (m.heads // t) * layout.mb * job.seq_len**2 * (2 * e + (2 * e + mask if m.dropout else 0))
    return {"norms, residuals": norms_and_residuals, "activation": activation, "softmax, dropout": scores}


def layer_times(job, layout):
    """Seconds of one layer for one micro-batch, by term."""
    gemms = layer_gemms(job.model, layout.mb, job.seq_len, layout.tp)
    hw = job.hardware
    sbh_bytes = job.seq_len * layout.mb * job.model.hidden * job.elem_bytes
    elem = elementwise_bytes(job, layout)
    t = {
        "fwd GEMM": sum(gemm_seconds(job, g) for g in gemms),
        "fwd element-wise": hw.memory_seconds(sum(elem.values())),
        "fwd TP all-reduce": 2 * tp_all_reduce(job, layout, sbh_bytes),
        # backward: every GEMM twice (dX and dW); the attention core's two are both dX work
        "bwd GEMM dX": sum(gemm_seconds(job, g) * (1 if g.weight else 2) for g in gemms),
        "bwd GEMM dW": sum(gemm_seconds(job, g) for g in gemms if g.weight),
        "bwd element-wise": 2 * hw.memory_seconds(sum(elem.values())),
        "bwd TP all-reduce": 2 * tp_all_reduce(job, layout, sbh_bytes),
    }
    if layout.recompute == "full":
        t["recompute forward"] = t["fwd GEMM"] + t["fwd element-wise"] + t["fwd TP all-reduce"]
    elif layout.recompute == "selective" and not job.engine.flash_attention:
        core = sum(gemm_seconds(job, g) for g in gemms if not g.weight)
        t["recompute attention"] = core + hw.memory_seconds(elem["softmax, dropout"])
    return t


def end_times(job, layout, first, last):
    """Extra work of the first stage (embedding) and the last (norm, logits, cross-entropy)."""
    m, hw, e = job.model, job.hardware, job.elem_bytes
    sb = job.seq_len * layout.mb
    sbh_bytes = sb * m.hidden * e
    extra = {}
    if first:   # token + position gather and the vocab-parallel embedding's all-reduce
        extra["embedding"] = (hw.memory_seconds(3 * sbh_bytes) + tp_all_reduce(job, layout, sbh_bytes),
                              hw.memory_seconds(2 * sbh_bytes), 0.0)
    if last:    # logits GEMM, fp32 softmax cross-entropy over V/t, 3 small all-reduces (max, sum, target)
        g = logits_gemm(m, layout.mb, job.seq_len, layout.tp)
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
    n = stage_layers(job.model.layers, layout.pp)[stage]
    lt = lt or layer_times(job, layout)
    recompute = lt.get("recompute forward", 0.0) + lt.get("recompute attention", 0.0)
    f = n * (lt["fwd GEMM"] + lt["fwd element-wise"] + lt["fwd TP all-reduce"])
    b = n * (lt["bwd GEMM dX"] + lt["bwd element-wise"] + lt["bwd TP all-reduce"] + recompute)
    w = n * lt["bwd GEMM dW"]
    terms = {k: n * v for k, v in lt.items()}
    for name, (ef, eb, ew) in end_times(job, layout, stage == 0, stage == layout.pp - 1).items():
        f, b, w = f + ef, b + eb, w + ew
        terms[name] = ef + eb + ew
    return StageTimes(f, b, w, terms)


def tp_comm_seconds(times):
    """The tensor-parallel communication inside a stage's F + B (for the communication share)."""
    return sum(v for k, v in times.terms.items() if "TP" in k)
