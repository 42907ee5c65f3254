"""Memory per GPU, term by term: model state, activations, buffers, workspace, allocator cache.

Model state, bytes per parameter (docs/design.md, Memory; Rajbhandari et al. 2020, ZeRO), before sharding:

    mixed precision (bf16)  hpcpar (precision.py): 2 compute copy + 4 fp32 gradients + 4 fp32 master
                            + 8 Adam m, v = 18 (its update works in one small scratch block); other engines
                            give theirs as ``mixed_state_bytes`` (Megatron with bf16: 2 + 4 + 12)
    fp32 / fp64             e + e + e * adam_buffers (Adam m and v)

ZeRO shards over the ``shard`` = dp * cp ranks that hold the same weights: stage 1 the optimizer
state, stage 2 the gradients as well, stage 3 (FSDP) the weights too - which then are all-gathered
one unit (a layer, or the embedding) at a time.  The table of what a rank holds at each stage, and
the working set a step adds (ZeRO-2's full gradient during the backward; ZeRO-3's gathered units and
their unsharded gradients), is the engine's: data_parallel/zero_memory.py's ``per_rank``, fed here
with the job's bytes a number (``number_bytes``).  An engine that, in a pipeline, gathers a stage's
weights once per step (torchtitan) keeps them whole all step, and an unsharded gradient accumulator
with them.

Activations kept per layer and micro-batch (Korthikanti et al. 2022, term by term): activations.py.
A stage keeps as many micro-batches in flight as its schedule dictates (``inflight``), and the ends
where its schedule places them: the embedding on the rank holding virtual stage 0, the head, the
logits and the loss on the one holding the last - both on rank 0 under a V (``Job.ends``).

Three terms no formula of the papers has, each explicit:

    loss                   the logits of one micro-batch at loss_bytes_per_logit: hpcpar keeps one fp32
                           (or fp64) array; eager PyTorch (``cross_entropy(logits.float())``) the 16-bit
                           logits, their fp32 copy and the fp32 log-softmax it saves: 2 + 4 + 4; a
                           fused cross-entropy kernel only the 16-bit logits: 2
    communication buffers  p2p send + receive of one activation, the sequence-parallel all-gather of
                           b*s*h, the ring-attention K/V chunks in flight (2 of them; all cp of them
                           where K and V are all-gathered), the engine's fixed collective buffers (NCCL)
    workspace              the transient arrays of one layer's backward (gradient of the scores or
                           of the MLP's hidden layer) plus the engine's fixed GEMM workspace
    allocator cache        what a caching allocator (PyTorch's) holds reserved beyond what is allocated:
                           freed blocks kept for reuse, split and fragmented, a share
                           engine.allocator_cache of what is allocated and freed step by step
                           (activations, gathered weights, logits, buffers, workspace).  It is part
                           of the memory such a framework reports (its peak reserved memory) but not
                           of what must fit: on a failed allocation the allocator releases its
                           cache and retries (Estimate.fits leaves it out)
"""
from dataclasses import dataclass, field

from hpcpar.data_parallel.zero_memory import fp8_gather_share, gathered_number_bytes, per_rank
from hpcpar.optim import state_arrays
from hpcpar.pipeline.schedules import KINDS
from hpcpar.tools.plan import experts
from hpcpar.tools.plan.activations import (MASK_BYTES, layer_activation_bytes, layer_activation_terms,
                                            tokens_per_rank)
from hpcpar.tools.plan.network import cp_chunk_bytes

# allocated once and kept all run; every other term is allocated and freed step by step
STATE_TERMS = ("weights", "gradients", "optimizer state")
ALLOCATOR_CACHE = "allocator cache"


def number_bytes(job):
    """Bytes a number for zero_memory.per_rank: the weights the optimizer updates (``master``), a
    compute copy beside them (``copy``), a gradient, the optimizer state, a gathered number."""
    e = job.elem_bytes
    matrix = state_arrays(job.engine.optimizer, matrix=True)         # Muon: one array for a block's matrix
    if job.dtype in ("fp32", "fp64"):
        return dict(master=e, grad=e, optimizer=e * job.engine.adam_buffers, matrix_optimizer=e * matrix, compute=e)
    if job.engine.mixed_state_bytes is None:      # precision.py: fp32 masters (whole until ZeRO-3) and
        # a 16-bit compute copy, fp32 gradients and optimizer arrays
        return dict(master=4, copy=2, grad=4, optimizer=4 * job.engine.adam_buffers, matrix_optimizer=4 * matrix,
                    compute=e)
    weights, grads, optim = job.engine.mixed_state_bytes
    return dict(master=weights, grad=grads, optimizer=optim, compute=e)


def state_bytes_per_param(job, zero=0, shard=1):
    """(weights, gradients, optimizer) bytes per parameter held by one rank under ZeRO stage ``zero``."""
    terms = per_rank(zero, shard, 1, 0, slice_buffer=job.engine.shard_grad_buffer, **number_bytes(job))
    return terms["weights"], terms["gradients"], terms["optimizer state"]


def fp8_share(job, layout):
    """The share of a ZeRO-3 block unit --fp8-param-gather gathers in FP8 (zero_memory.py)."""
    return fp8_gather_share(job.model, layout.tp, layout.ep, layout.shard)


def own_head(job, ends):
    """Whether the head's projection is a matrix of its own, with the ends (first, last rank) at ``ends``:
    untied, or tied but on another rank than the embedding (a copy); one rank holding both ends (pp 1,
    a V) ties them in memory (training/step.py)."""
    return not job.model.tied or ends[0] != ends[1]


def stage_params(job, layout, stage):
    """Parameters held by one rank of pipeline stage ``stage`` (before ZeRO): the model shape's count
    (hpcpar/shape.py) for the layers the engine puts there, and the ends the schedule places there."""
    ends = job.ends(layout)
    return job.model.stage_params(job.stage_layers(layout)[stage], stage == ends[0], stage == ends[1], job.seq_len,
                                  own_head=own_head(job, ends), tp=layout.tp)


def analytic_inflight(schedule, p, m, v, stage):
    """Chunk-forwards a stage holds at its peak, each from its F until its B frees it - or its W where the
    backward is split (a W still needs the layer's inputs; counted whole, as Qi et al. 2024 do):
    GPipe all, 1F1B p - stage (PipeDream-Flush), interleaved Megatron's warm-up count
    2*(p - stage - 1) + (v - 1)*p plus the one in progress; ZB-H1 and ZB-H2 postpone rank r's Ws by r
    and 2r backwards, which brings every rank to rank 0's p and 2p - 1 (the paper's table); ZB-V 2p
    chunks of half a stage, p stages as 1F1B's rank 0, on every rank (its section 6), fewer on the first
    ranks below 2p - 1 micro-batches; DualPipeV 2p + 1, DualPipe's README's PP + 1.  The search's
    simulated layouts count them from the schedule's order instead (bubble.held_inflight); the two
    agree for p <= 16 (tests/test_plan_bubble.py)."""
    if KINDS[schedule].all_forwards_first:
        return m * v
    if schedule == "zb-h2":
        return min(m, 2 * p - 1)
    if schedule == "zb-v":
        return min(2 * p, m + min(m, stage + 1))
    if schedule == "dualpipev":        # m >= 2p: the schedule refuses fewer
        return 2 * p + 1
    if KINDS[schedule].chunked:
        return min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1)
    if KINDS[schedule].split_backward:     # zb-h1
        return min(m, p)
    return min(m, p - stage)


def fsdp_unit_params(job, layout, stage):
    """ZeRO-3's largest unit on a rank of ``stage``: a layer as it is gathered (shape.py), or the
    embedding (or its copy for the head) where the stage holds one; their TP shards."""
    m, ends = job.model, job.ends(layout)
    holds_end = stage == ends[0] or (stage == ends[1] and own_head(job, ends))
    return max(m.gathered_block_params(layout.tp, layout.ep, layout.shard),
               m.vocab * m.hidden / layout.tp if holds_end else 0)


def keeps_stage_gathered(job, layout):
    """ZeRO-3 in a pipeline that gathers the stage once per step rather than per micro-batch."""
    return layout.pp > 1 and job.engine.fsdp_gather_once_with_pp


def comm_buffer_bytes(job, layout):
    """Send and receive buffers of the collectives and p2p transfers a micro-batch uses."""
    m, e = job.model, job.elem_bytes
    sbh = tokens_per_rank(job, layout) * m.hidden * e
    total = job.engine.collective_buffer_bytes
    if layout.pp > 1:
        total += 2 * sbh / (layout.tp if layout.sp else 1)
    if layout.sp:
        total += sbh
    if layout.cp > 1:      # two K/V chunks of a ring (the one in use, the one arriving), or all cp gathered
        total += (layout.cp if job.engine.cp_allgather else 2) * cp_chunk_bytes(job, layout)
    return total + experts.buffer_bytes(m, layout, tokens_per_rank(job, layout), e)


def workspace_bytes(job, layout):
    """The transient arrays of one layer's backward: the larger of attention's (gradient of the
    scores, twice; dQKV and dO) and the MLP's (gradient of the hidden layer and of its input)."""
    m, t, e = job.model, layout.tp, job.elem_bytes
    sb = tokens_per_rank(job, layout)
    scores = 0 if job.engine.flash_attention else 2 * (m.heads // t) * sb * job.seq_len * e
    attention = scores + sb * e * (m.qkv_width + m.attention_width) / t
    mlp = experts.workspace_bytes(m, layout, sb, e) if m.experts else \
        sb * e * (2 * (2 if m.gated else 1) * m.ffn / t + m.hidden)
    return max(attention, mlp) + job.engine.gemm_workspace_bytes


@dataclass(frozen=True)
class LayoutMemory:
    """What every stage of a layout shares, computed once per layout (the search asks for every stage)."""
    numbers: dict          # bytes a number (number_bytes)
    per_layer: float       # activation bytes one layer keeps per micro-batch
    working_set: float     # full recomputation: one layer's whole set, rebuilt for its backward
    comm: float
    workspace: float
    # the model state of a rank, by (its layers, whether it holds the embedding, the head): ranks
    # alike in these hold the same (the middle stages of a pipeline), so it is worked out once
    states: dict = field(default_factory=dict, compare=False)


def layout_memory(job, layout):
    lay = layout
    numbers = number_bytes(job)
    if job.engine.fp8_param_gather and lay.zero >= 3:     # the quantised weights gathered as FP8 codes
        numbers["compute"] = gathered_number_bytes(numbers["compute"], fp8_share(job, lay))
    return LayoutMemory(numbers, layer_activation_bytes(job, lay),
                        sum(layer_activation_terms(job, lay).values()) if lay.recompute == "full" else 0.0,
                        comm_buffer_bytes(job, lay), workspace_bytes(job, lay))


def state_memory(job, layout, stage, layers, numbers):
    """Weights, gradients, optimizer state and ZeRO working set (bytes) of a rank of ``stage``."""
    lay = layout
    once = keeps_stage_gathered(job, lay)
    accumulates = job.engine.fsdp_reduce_once and job.micro_batches(lay) > 1
    terms = experts.state_terms(job.model, lay, stage_params(job, lay, stage), layers,
                                fsdp_unit_params(job, lay, stage), slice_buffer=job.engine.shard_grad_buffer,
                                reshard=not once, whole_grads=once or accumulates, **numbers)
    if not terms["ZeRO working set"]:
        del terms["ZeRO working set"]
    return terms


def stage_memory(job, layout, stage, inflight, shared=None):
    """Memory terms (bytes) on one rank of ``stage`` holding ``inflight`` chunk-forwards at its peak;
    ``shared``: the layout's LayoutMemory, if the caller has it."""
    m, lay = job.model, layout
    shared = shared or layout_memory(job, lay)
    key = layers, first, last = job.stage_classes(lay)[stage]
    if key not in shared.states:
        shared.states[key] = state_memory(job, lay, stage, layers, shared.numbers)
    terms = dict(shared.states[key])
    terms["activations"] = shared.per_layer * layers / lay.v * inflight
    if lay.recompute == "full":   # the layer being back-propagated holds its full set again
        terms["recompute working set"] = shared.working_set
    sbh = tokens_per_rank(job, lay) * m.hidden / (lay.tp if lay.sp else 1)
    if first and m.dropout:   # the embedding's dropout mask, per micro-batch in flight
        # (with v > 1 every chunk-forward the rank holds is counted, an upper bound)
        terms["embedding dropout"] = sbh * MASK_BYTES * inflight
    if last:                       # final norm input, head input and the loss's logits
        # one micro-batch's: the loss's backward follows the last chunk's forward at once, except in
        # GPipe, where every forward comes first
        at_once = inflight if KINDS[lay.schedule].all_forwards_first else 1
        logits = max(job.engine.loss_bytes_per_logit, job.elem_bytes) * tokens_per_rank(job, lay) * m.vocab / lay.tp
        terms["head and logits"] = (2 * sbh * job.elem_bytes + logits) * at_once
    terms["communication buffers"] = shared.comm
    terms["workspace"] = shared.workspace
    dynamic = sum(v for k, v in terms.items() if k not in STATE_TERMS)
    if job.engine.allocator_cache:
        terms[ALLOCATOR_CACHE] = job.engine.allocator_cache * dynamic
    return terms


def memory_per_stage(job, layout, inflight=None):
    """Total bytes per rank for every stage; ``inflight`` per stage (default: analytic)."""
    p, mb = layout.pp, job.micro_batches(layout)
    if inflight is None:
        inflight = [analytic_inflight(layout.schedule, p, mb, layout.v, i) for i in range(p)]
    shared = layout_memory(job, layout)
    return [sum(stage_memory(job, layout, i, inflight[i], shared).values()) for i in range(p)]
