"""Memory per GPU, term by term: model state, activations, buffers, workspace, allocator cache.

Model state, bytes per parameter (docs/design.md, Memory; Rajbhandari et al. 2020, ZeRO), before sharding:

    mixed precision (bf16)  hpcpar (precision.py): 2 compute copy + 4 fp32 gradients + 4 fp32 master
                            + 8 Adam m, v = 18, and 4 more for its Adam scratch array; other engines
                            give theirs as ``mixed_state_bytes`` (Megatron with bf16: 2 + 4 + 12)
    fp32 / fp64             e + e + e * adam_buffers (Adam m and v; hpcpar adds one scratch array)

ZeRO shards over the ``shard`` = dp * cp ranks that hold the same weights: stage 1 the optimizer
state (hpcpar reduce-scatters into a separate 1/shard gradient buffer), stage 2 the gradients as well, stage 3 (FSDP) the weights too - which then are all-gathered
one unit (a layer, or the embedding) at a time: the unit in use and the one prefetched are whole
(16-bit), with the unit's unsharded gradient before its reduce-scatter.  An engine that, in a
pipeline, gathers a stage's weights once per step (torchtitan) keeps them whole all step, and an
unsharded gradient accumulator with them.

Activations kept per layer and micro-batch, 16-bit (Korthikanti et al. 2022, section 4):

    no parallelism        s*b*h*(34 + 5*a*s/h)  bytes
    tensor parallel       s*b*h*(10 + 24/t + 5*a*s/(h*t))
    + sequence parallel   s*b*h*(34 + 5*a*s/h) / t
    selective recompute   drops the 5*a*s/h term (the attention scores are recomputed); PyTorch's
                          op-level policy (engine.selective_ops) keeps the layer input, the attention
                          output and every second GEMM output instead
    full recompute        keeps only each layer's input, 2*s*b*h (/t with sp), plus one layer's full
                          set while that layer's backward runs

counted here from the stored tensors themselves, so other shapes follow (GQA, gated MLPs, fp32/fp64
engines, no dropout, hpcpar's extra scaled-Q and GELU caches); context parallelism divides s by cp.
A stage keeps as many micro-batches in flight as its schedule dictates (``inflight``).

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
from hpcpar.pipeline.schedules import KINDS
from hpcpar.plan.flops import kv_heads_per_rank
from hpcpar.plan.layout import stage_layers
from hpcpar.plan.network import cp_chunk_bytes

MASK_BYTES = 1    # a dropout mask element
# allocated once and kept all run; every other term is allocated and freed step by step
STATE_TERMS = ("weights", "gradients", "optimizer state", "ZeRO gradient shard")
ALLOCATOR_CACHE = "allocator cache"


def state_bytes_per_param(job, zero=0, shard=1):
    """(weights, gradients, optimizer) bytes per parameter held by one rank under ZeRO stage ``zero``."""
    e = job.elem_bytes
    if job.dtype in ("fp32", "fp64"):
        weights, grads, optim = e, e, e * job.engine.adam_buffers
    elif job.engine.mixed_state_bytes is None:     # precision.py: fp32 gradients, master and Adam state
        weights, grads, optim = 2, 4, 4 + 4 * job.engine.adam_buffers
    else:
        weights, grads, optim = job.engine.mixed_state_bytes
    return (weights / (shard if zero >= 3 else 1), grads / (shard if zero >= 2 else 1),
            optim / (shard if zero >= 1 else 1))


def stage_params(job, layout, stage):
    """Parameters held by one rank of pipeline stage ``stage`` (before ZeRO)."""
    m, t = job.model, layout.tp
    layers = stage_layers(m.layers, layout.pp)[stage]
    count = layers * m.layer_params() / t
    if stage == 0:
        count += m.vocab * m.hidden / t + (job.seq_len * m.hidden if m.positions == "learned" else 0)
    if stage == layout.pp - 1:
        count += (2 if m.biases else 1) * m.hidden          # final norm
        if not m.tied or layout.pp > 1:                     # the output layer (a copy of a tied embedding)
            count += m.vocab * m.hidden / t
    return count


def tokens_per_rank(job, layout):
    """s*b of one micro-batch on one rank: context parallelism holds s/cp of each sequence."""
    return job.seq_len // layout.cp * layout.mb


def layer_activation_terms(job, layout):
    """Bytes one layer keeps for one micro-batch, by kind (no recomputation)."""
    m, t, e = job.model, layout.tp, job.elem_bytes
    sb = tokens_per_rank(job, layout)
    mask = MASK_BYTES if m.dropout else 0
    d, f = m.head_dim, m.ffn
    # LayerNorm inputs, QKV and MLP inputs (4 tensors of h) and two dropout masks: replicated over TP
    # unless sequence parallelism shards them along the sequence.
    replicated = sb * m.hidden * (4 * e + 2 * mask) / (t if layout.sp else 1)
    # Q, K, V, the attention output (the out-projection's input), the MLP's activation input and output
    kv = kv_heads_per_rank(m, t) * d
    mlp = (3 if m.gated else 2) * f / t
    parallel = sb * e * (m.hidden / t + 2 * kv + m.hidden / t + mlp)
    if job.engine.numpy_caches:      # hpcpar also keeps the scaled Q and GELU's tanh (ops/attention, activation)
        parallel += sb * e * (m.hidden + f) / t
    heads = m.heads // t
    if job.engine.flash_attention:
        scores = sb * heads * 4                 # fp32 log-sum-exp per row, the s*s matrix is never stored
    else:                                       # softmax output, dropout mask and dropout output
        scores = heads * sb * job.seq_len * (e + (mask + e if m.dropout else 0))
    return {"replicated (norm inputs, masks)": replicated, "tensor-parallel (QKV, attn, MLP)": parallel,
            "attention scores": scores}


def op_level_selective_bytes(job, layout):
    """PyTorch's op-level selective checkpointing (torchtitan): a layer keeps its input, the attention
    output with its log-sum-exp and every second GEMM output; the rest is recomputed from them."""
    m, t = job.model, layout.tp
    seq_split = t if layout.sp else 1
    # per rank: q, k, v and the MLP's up (and gate) projections column-parallel; the attention output
    # projection and the MLP's down projection full width, split along the sequence with sp
    outputs = (m.hidden + 2 * kv_heads_per_rank(m, t) * m.head_dim + (2 if m.gated else 1) * m.ffn) / t \
        + 2 * m.hidden / seq_split
    kept = m.hidden / seq_split + m.hidden / t + outputs / 2
    sb = tokens_per_rank(job, layout)
    return sb * (kept * job.elem_bytes + m.heads // t * 4)


def layer_activation_bytes(job, layout):
    """Bytes one layer keeps per micro-batch under the layout's recomputation."""
    terms = layer_activation_terms(job, layout)
    if layout.recompute == "full":
        return tokens_per_rank(job, layout) * job.model.hidden * job.elem_bytes / (layout.tp if layout.sp else 1)
    if layout.recompute == "selective" and job.engine.selective_ops:
        return op_level_selective_bytes(job, layout)
    if layout.recompute == "selective" and not job.engine.flash_attention:
        return sum(terms.values()) - terms["attention scores"]
    return sum(terms.values())


def analytic_inflight(schedule, p, m, v, stage):
    """Chunk-forwards a stage holds at its peak: GPipe all, 1F1B p - stage (PipeDream-Flush),
    interleaved Megatron's warm-up count 2*(p - stage - 1) + (v - 1)*p, plus the one in progress."""
    if KINDS[schedule].all_forwards_first:
        return m * v
    if KINDS[schedule].chunked:
        return min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1)
    return min(m, p - stage)


def fsdp_unit_bytes(job, layout):
    """ZeRO-3: the whole weights (compute precision) of the unit in use and the prefetched one, and
    one unit's gradient before its reduce-scatter."""
    m, t = job.model, layout.tp
    unit = max(m.layer_params(), m.vocab * m.hidden) / t
    return unit * (2 * job.elem_bytes + state_bytes_per_param(job)[1])


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
    return total


def workspace_bytes(job, layout):
    """The transient arrays of one layer's backward: the larger of attention's (gradient of the
    scores, twice; dQKV and dO) and the MLP's (gradient of the hidden layer and of its input)."""
    m, t, e = job.model, layout.tp, job.elem_bytes
    sb = tokens_per_rank(job, layout)
    scores = 0 if job.engine.flash_attention else 2 * (m.heads // t) * sb * job.seq_len * e
    attention = scores + sb * e * (m.qkv_width + m.hidden) / t
    mlp = sb * e * (2 * (2 if m.gated else 1) * m.ffn / t + m.hidden)
    return max(attention, mlp) + job.engine.gemm_workspace_bytes


def stage_memory(job, layout, stage, inflight):
    """Memory terms (bytes) on one rank of ``stage`` holding ``inflight`` chunk-forwards at its peak."""
    m, lay = job.model, layout
    params = stage_params(job, lay, stage)
    w, g, o = state_bytes_per_param(job, lay.zero, lay.shard)
    layers = stage_layers(m.layers, lay.pp)[stage]
    chunk = layer_activation_bytes(job, lay) * layers / lay.v
    terms = {"weights": params * w, "gradients": params * g, "optimizer state": params * o}
    if lay.zero >= 3 and keeps_stage_gathered(job, lay):
        terms["FSDP gathered stage"] = params * (job.elem_bytes + state_bytes_per_param(job)[1])
    elif lay.zero >= 3:
        terms["FSDP gathered units"] = fsdp_unit_bytes(job, lay)
    terms["activations"] = chunk * inflight
    if lay.recompute == "full":   # the layer being back-propagated holds its full set again
        terms["recompute working set"] = sum(layer_activation_terms(job, lay).values())
    sbh = tokens_per_rank(job, lay) * m.hidden / (lay.tp if lay.sp else 1)
    if stage == 0 and m.dropout:   # the embedding's dropout mask, per micro-batch in flight
        terms["embedding dropout"] = sbh * MASK_BYTES * inflight
    if stage == lay.pp - 1:        # final norm input, head input and the loss's logits
        # one micro-batch's: the loss's backward follows the last chunk's forward at once, except in
        # GPipe, where every forward comes first
        at_once = inflight if KINDS[lay.schedule].all_forwards_first else 1
        logits = max(job.engine.loss_bytes_per_logit, job.elem_bytes) * tokens_per_rank(job, lay) * m.vocab / lay.tp
        terms["head and logits"] = (2 * sbh * job.elem_bytes + logits) * at_once
    if lay.zero in (1, 2) and job.engine.shard_grad_buffer:
        terms["ZeRO gradient shard"] = params * state_bytes_per_param(job)[1] / lay.shard
    terms["communication buffers"] = comm_buffer_bytes(job, lay)
    terms["workspace"] = workspace_bytes(job, lay)
    dynamic = sum(v for k, v in terms.items() if k not in STATE_TERMS)
    if job.engine.allocator_cache:
        terms[ALLOCATOR_CACHE] = job.engine.allocator_cache * dynamic
    return terms


def memory_per_stage(job, layout, inflight=None):
    """Total bytes per rank for every stage; ``inflight`` per stage (default: analytic)."""
    p, mb = layout.pp, job.micro_batches(layout)
    if inflight is None:
        inflight = [analytic_inflight(layout.schedule, p, mb, layout.v, i) for i in range(p)]
    return [sum(stage_memory(job, layout, i, inflight[i]).values()) for i in range(p)]
