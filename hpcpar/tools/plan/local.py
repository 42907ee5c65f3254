"""Predicting ``hpcpar train`` on this machine, from a profile ``hpcpar plan calibrate`` wrote.

The model is one of the engine's GPT presets (hpcpar/nn/gpt.py; the vocabulary is the synthetic
language's 32 tokens unless the preset fixes it):

    tiny   2 layers, d_model 64, 4 heads, sequence 64
    small  4 layers, d_model 256, 8 heads, sequence 128

One step of a layout, on the rank that finishes last:

    step = pipeline makespan  +  exposed DP all-reduce  +  rest

* Each virtual stage's F and B for one micro-batch (b = batch / (dp * m) sequences): cpu.py's pass
  time plus its tensor-parallel all-reduces, each alpha + bytes / beta with the [engine] constants
  fitted to the collectives inside probe steps:
      forward   2n of b*s*h elements (attention and MLP outputs), + [first] 1 (vocab-parallel
                embedding), + [last] 2 small ones of b*s and 2*b*s (the vocab-parallel loss)
      backward  2n of b*s*h, + [last] 1 (the head's input gradient)
* With pp > 1 all but a stage's first forward of the step reuse memory (cpu.py: warm).
* The pipeline: the simulator (bubble.py over hpcpar/pipeline/simulate.py) runs the schedule with the
  slowest stage's F and B and the ping-pong time of one activation between stages; W = 0 (the
  engine's backward is one action).
* DP: the rank's gradients in buckets of bucket_mb MiB, k * dp_latency + bytes / dp_bandwidth.
  MPICH moves a non-blocking all-reduce only inside MPI calls, and a one-stage backward makes none, so
  all of it shows (with pp > 1 the p2p calls move part of it early: still counted whole).
* rest: cpu.py's time outside the actions for the rank's micro-batches and parameters.
"""
import math
from dataclasses import dataclass, replace

from hpcpar.pipeline.schedules import KINDS, build
from hpcpar.tools.plan.bubble import simulate_pipeline
from hpcpar.tools.plan.cpu import CpuCosts, Pass
from hpcpar.tools.plan.hardware import load_hardware
from hpcpar.tools.plan.job import Engine, Job
from hpcpar.tools.plan.layout import Layout
from hpcpar.tools.plan.memory import memory_per_stage, stage_params
from hpcpar.runtime import UsageError

DTYPES = {"float32": "fp32", "float64": "fp64"}
# cpu.py fits F and B passes only: no schedule that runs W on its own
SCHEDULES = tuple(name for name, kind in KINDS.items() if not kind.split_backward)


@dataclass
class Chunk:
    """One virtual stage's pass times for one micro-batch."""
    stage: int
    chunk: int
    work: Pass
    forward: dict          # term -> seconds (cpu.py terms, "GEMM", "TP all-reduce")
    backward: dict


@dataclass
class LocalEstimate:
    flags: dict            # the hpcpar train flags
    cpu: object            # cpu.CpuCosts of the dtype
    job: object
    layout: object
    microbatches: int
    chunks: list           # Chunk of every virtual stage
    costs: tuple           # (F, B) of the slowest virtual stage
    p2p: float
    pipeline: object       # PipelineResult
    dp: float
    rest: float
    params: float          # parameters on the fullest rank
    step: float

    @property
    def tp_comm(self):
        """TP all-reduce seconds in the step of the slowest rank (m micro-batches of its chunks)."""
        per_mb = max(sum(c.forward["TP all-reduce"] + c.backward["TP all-reduce"]
                         for c in self.chunks if c.stage == s) for s in range(self.layout.pp))
        return per_mb * self.microbatches


def train_engine(**features):
    """The Engine of an hpcpar train run on a host: its default cut of layers into stages (its
    --partition; Engine's default is the published engines' cut) and the attention core's causal
    blocks (ops/attention.py; a GPU runs one block); ``features``: any others the caller sets."""
    from hpcpar.training.config import TrainConfig
    return Engine(causal_blocks=True, partition=TrainConfig().partition, **features)


def engine_shape(cfg, name):
    """The shape of an engine GPTConfig - the engine's own (``GPTConfig.shape``, from the architecture
    registry), named; a vocabulary of 0 is the synthetic language's."""
    from hpcpar.training.config import TrainConfig
    return replace(cfg.shape, name=name, vocab=cfg.vocab_size or TrainConfig().synthetic_vocab)


def zero_stage(train_cfg):
    """The ZeRO stage 0-3 of an hpcpar train configuration (--zero, or its alias --zero1)."""
    return max(train_cfg.zero, int(train_cfg.zero1))


def recompute_policy(train_cfg):
    """The planner's recomputation of an hpcpar train configuration: --recompute recomputes whole
    blocks, --recompute-attention the attention probabilities (selective)."""
    return "full" if train_cfg.recompute else "selective" if train_cfg.recompute_attention else "none"


def engine_costs(hw, dtype):
    if dtype not in hw.engine:
        raise UsageError(f"hardware profile {hw.name} has no [engine.{dtype}] table: write one with "
                         "`hpcpar plan calibrate --out PROFILE`")
    return CpuCosts.from_table(hw.engine[dtype])


def tp_all_reduces(work):
    """(forward, backward) element counts of one pass's tensor-parallel all-reduces (module docstring)."""
    if work.tp == 1:
        return [], []
    tokens = work.mb * work.seq_len
    big = tokens * work.model.hidden
    return ([big] * (2 * work.blocks + work.first) + ([tokens, 2 * tokens] if work.last else []),
            [big] * (2 * work.blocks + work.last))


def all_reduce_seconds(hw, sizes, elem_bytes):
    """alpha + bytes / beta for each all-reduce, with the [engine] constants."""
    e = hw.engine
    return sum(e["allreduce_latency_us"] * 1e-6 + n * elem_bytes / (e["allreduce_GBps"] * 1e9) for n in sizes)


def predict_local(profile, model="tiny", tp=1, pp=1, dp=1, schedule="1f1b", microbatches=0, chunks=0,
                  batch_size=16, dtype="float32", bucket_mb=4.0, cp=1, recompute="none", zero=0):
    """The LocalEstimate of one ``hpcpar train`` step with these flags (same names and defaults;
    ``recompute`` and ``zero`` as the planner reads them: recompute_policy, zero_stage).  cp, the
    recomputation and ZeRO are part of the layout and of its memory; the CPU time model has no term
    for them (the times are those of the run without them)."""
    from hpcpar.nn.gpt import PRESETS
    from hpcpar.pipeline.partition import partition
    if model not in PRESETS or dtype not in DTYPES or schedule not in SCHEDULES:
        raise UsageError(f"local prediction: --model {'|'.join(PRESETS)}, --dtype {'|'.join(DTYPES)}, "
                         f"--schedule {'|'.join(SCHEDULES)}")
    preset = PRESETS[model]
    if preset.n_expert:
        # hpcpar plan models experts on GPUs (tools/plan/experts.py); the CPU model here is fitted to probes
        # without them (calibrate.PROBES), so it has no term for the router, the permutation, the loop
        # over experts or the all-to-alls, and would invent one
        raise UsageError(f"local prediction: --model {model} has experts; the CPU model's constants were fitted "
                         "without any (no router, permutation or all-to-all term): use hpcpar plan on a GPU "
                         "profile for the expert arithmetic")
    seq_len = preset.seq_len
    hw = load_hardware(profile)
    costs = engine_costs(hw, dtype)
    m, v = microbatches or pp, chunks or KINDS[schedule].default_chunks
    ranks = tp * cp * pp * dp
    job = Job(engine_shape(preset, model), hw, ranks, ranks, batch_size, seq_len, dtype=DTYPES[dtype],
              engine=train_engine(bucket_bytes=bucket_mb * 2**20))
    if batch_size % (dp * m):
        raise UsageError(f"batch {batch_size} does not divide into dp x micro-batches = {dp} x {m}")
    layout = Layout(tp, pp, dp, batch_size // (dp * m), v, schedule, recompute, zero, cp=cp)
    reason = job.check(layout)
    if reason:
        raise UsageError(reason)
    ranges = partition(job.model.layers, pp * v, job.engine.partition)
    held = build(schedule, pp, m, v).holders()        # virtual stage -> (rank, chunk): the schedule's placement
    out = []
    for s, blocks in enumerate(ranges):
        work = Pass(job.model, seq_len, layout.mb, len(blocks), tp, first=s == 0, last=s == pp * v - 1)
        fwd = costs.pass_terms(work, reused=(m * v - 1) / (m * v) if pp > 1 else 0.0)
        bwd = costs.pass_terms(work, backward=True)
        calls = tp_all_reduces(work)
        fwd["TP all-reduce"], bwd["TP all-reduce"] = (all_reduce_seconds(hw, c, job.elem_bytes) for c in calls)
        out.append(Chunk(*held[s], work, fwd, bwd))
    F = max(sum(c.forward.values()) for c in out)
    B = max(sum(c.backward.values()) for c in out)
    p2p = hw.intra.seconds(layout.mb * seq_len * job.model.hidden * job.elem_bytes) if pp > 1 else 0.0
    pipe = simulate_pipeline(schedule, pp, m, v, F, B, 0.0, p2p)
    params = max(stage_params(job, layout, i) for i in range(pp))
    grad_bytes = params * job.elem_bytes
    e = hw.engine
    dp_time = 0.0 if dp == 1 else (math.ceil(grad_bytes / (bucket_mb * 2**20)) * e["dp_latency_us"] * 1e-6
                                   + grad_bytes / (e["dp_GBps"] * 1e9))
    rest = costs.rest_seconds(m * v, params)
    flags = dict(model=model, dtype=dtype, tp=tp, pp=pp, dp=dp, schedule=schedule, microbatches=m,
                 batch_size=batch_size, cp=cp, recompute=recompute, zero=zero)
    return LocalEstimate(flags, costs, job, layout, m, out, (F, B), p2p, pipe, dp_time, rest, params,
                         pipe.makespan + dp_time + rest)


def _row(term, formula, units, constant, forward, backward=None):
    back = "" if backward is None else f"{backward * 1e3:10.2f} ms"
    return f"  {term:14s}{formula:26s}{units:>13s}  {constant:24s}{forward * 1e3:8.2f} ms{back}"


def _pass_lines(est, c):
    """The terms of one virtual stage's F and B, with their units and constants."""
    cpu, p, e = est.cpu, c.work, est.job.hardware.engine
    units = p.units()
    soft = "n N a s / t" + (" + N V / t" if p.last else "")
    formulas = {"rep": "n N h", "split": "n N (4h + f) / t", "soft": soft, "block": "n",
                "end": "[first] + [last]"}
    lines = [_row("GEMM", f"FLOPs / {cpu.gemm_rate / 1e9:.1f} GFLOP/s", f"{p.gemm_flops() / 1e9:.3f} G",
                  "(backward: x 2)", c.forward["GEMM"], c.backward["GEMM"])]
    for k, formula in formulas.items():
        scale, unit = (1e6, "us") if k in ("block", "end") else (1e9, "ns")
        lines.append(_row(k, formula, f"{units[k]:,.0f}", f"x {cpu.forward[k] * scale:.3g} / "
                          f"{cpu.backward[k] * scale:.3g} {unit}", c.forward[k], c.backward[k]))
    if "memory reused" in c.forward:
        lines.append(_row("memory reused", "(m - 1) / m of forwards", "", f"element-wise x {cpu.warm:.2f}",
                          c.forward["memory reused"]))
    if p.tp > 1:
        f, b = (len(x) for x in tp_all_reduces(p))
        formula = f"{e['allreduce_latency_us']:.1f} us + B / {e['allreduce_GBps']:.2f} GB/s"
        lines.append(_row("TP all-reduce", formula, f"{f} / {b} calls", "", c.forward["TP all-reduce"],
                          c.backward["TP all-reduce"]))
    return lines + [_row("total", "", "", "F, B", sum(c.forward.values()), sum(c.backward.values()))]


def explain_local(est):
    """Every term of a LocalEstimate, with its formula and numbers (hpcpar plan local)."""
    f, lay, job, pipe, e = est.flags, est.layout, est.job, est.pipeline, est.job.hardware.engine
    m, mv, ms = est.microbatches, est.microbatches * est.layout.v, 1e3
    slow = max(est.chunks, key=lambda c: sum(c.forward.values()) + sum(c.backward.values()))
    p = slow.work
    ends = "".join(x for x, y in ((", embedding", p.first), (", head", p.last)) if y)
    lines = [f"LOCAL hpcpar train --model {f['model']} --dtype {f['dtype']} --batch-size {f['batch_size']}: "
             f"tp {lay.tp} x pp {lay.pp} x dp {lay.dp}, {lay.schedule}, {m} micro-batch(es) of {lay.mb} x "
             f"{job.seq_len} tokens",
             f"LAYOUT {lay}: cp {lay.cp}, recomputation {lay.recompute}, ZeRO stage {lay.zero}"
             + (" (in the memory below; the CPU time model has no term for them)"
                if (lay.cp, lay.recompute, lay.zero) != (1, "none", 0) else ""),
             f"MEMORY {max(memory_per_stage(job, lay)) / 1e6:.2f} MB on the fullest rank (memory.py)",
             "",
             f"ONE PASS of a micro-batch, N = {lay.mb * job.seq_len} tokens, through stage {slow.stage}"
             + (f" chunk {slow.chunk}" if lay.v > 1 else "") + f" ({p.blocks} block(s){ends}) on 1 of {lay.tp} "
             "TP ranks; "
             f"h {job.model.hidden}, f {job.model.ffn}, a {job.model.heads}, s {job.seq_len}, V {job.model.vocab}",
             f"  {'term':14s}{'formula':26s}{'units':>13s}  {'F / B per unit':24s}{'forward':>11s}{'backward':>13s}",
             *_pass_lines(est, slow), ""]
    if lay.pp > 1:
        lines += [f"PIPELINE {lay.schedule}, p {lay.pp}, m {m}, v {lay.v}: slowest F {est.costs[0] * ms:.2f} ms, "
                  f"B {est.costs[1] * ms:.2f} ms; p2p {est.p2p * 1e6:.0f} us (ping-pong alpha + bytes / beta)",
                  f"  simulated (hpcpar.pipeline.simulate): makespan {pipe.makespan * ms:.2f} ms, "
                  f"bubble {pipe.bubble:.1%}"]
    else:
        lines.append(f"PIPELINE one stage: m (F + B) = {m} x {sum(est.costs) * ms:.2f} = {pipe.makespan * ms:.2f} ms")
    if lay.dp > 1:
        lines.append(f"DP {est.params * job.elem_bytes / 1e6:.2f} MB of gradients in buckets: k x "
                     f"{e['dp_latency_us']:.1f} us + bytes / {e['dp_GBps']:.2f} GB/s = {est.dp * ms:.2f} ms, "
                     "all exposed")
    r = est.cpu.rest
    lines += [f"REST step + microbatch x {mv} + param x {est.params / 1e6:.3f} M = {r['step'] * ms:.2f} + "
              f"{r['microbatch'] * ms:.3f} x {mv} + {r['param'] * 1e9:.2f} ns x {est.params / 1e6:.3f} M = "
              f"{est.rest * ms:.2f} ms",
              f"STEP {est.step * ms:.2f} ms = pipeline {pipe.makespan * ms:.2f} + DP {est.dp * ms:.2f} + rest "
              f"{est.rest * ms:.2f};  {job.global_batch * job.seq_len / est.step:,.0f} tokens/s"
              + (f"; TP all-reduces {est.tp_comm * ms:.2f} ms of it" if lay.tp > 1 else "")]
    return "\n".join(lines)
