"""Memory per GPU: model state plus the activations kept for the backward pass.

Model state, bytes per parameter (docs/design.md, Memory; Rajbhandari et al. 2020, ZeRO):

    mixed precision (bf16)  2 weights + 2 gradients + 12 optimizer (fp32 master, Adam m and v) = 16
    fp32                    4 + 4 + 8 (Adam m, v)                                              = 16
    fp64                    8 + 8 + 16                                                         = 32

A stage holds its layers' parameters divided by tp (plus the embedding on the first stage, the output
layer - the tied embedding's copy - on the last); ZeRO-1 divides the optimizer part by dp as well.

Activations kept per layer and micro-batch, 16-bit (Korthikanti et al. 2022, section 4):

    no parallelism        s*b*h*(34 + 5*a*s/h)  bytes
    tensor parallel       s*b*h*(10 + 24/t + 5*a*s/(h*t))
    + sequence parallel   s*b*h*(34 + 5*a*s/h) / t
    selective recompute   drops the 5*a*s/h term (the attention scores are recomputed)
    full recompute        keeps only each layer's input, 2*s*b*h (/t with sp), plus one layer's full
                          set while that layer's backward runs

Here the terms are counted from the stored tensors themselves, so other shapes follow too (GQA,
gated MLPs, fp32/fp64 engines, no dropout); for a GPT with dropout in 16-bit they are exactly the
formulas above.  A stage keeps as many micro-batches in flight as its schedule dictates
(``inflight``: the pipeline simulator's peak count, or the analytic one below).
"""
from hpcpar.plan.flops import kv_heads_per_rank
from hpcpar.plan.layout import stage_layers

MASK_BYTES = 1    # a dropout mask element


def state_bytes_per_param(job, zero1=False, dp=1):
    """(weights, gradients, optimizer) bytes per parameter held by one rank."""
    plain = {"fp32": (4, 4, 8), "fp64": (8, 8, 16)}
    weights, grads, optim = plain.get(job.dtype, job.engine.mixed_state_bytes)
    return weights, grads, optim / (dp if zero1 else 1)


def stage_params(job, layout, stage):
    """Parameters held by one rank of pipeline stage ``stage``."""
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


def layer_activation_terms(job, layout):
    """Bytes one layer keeps for one micro-batch, by kind (no recomputation)."""
    m, t, e = job.model, layout.tp, job.elem_bytes
    sb = job.seq_len * layout.mb
    mask = MASK_BYTES if m.dropout else 0
    d, f = m.head_dim, m.ffn
    # LayerNorm inputs, QKV and MLP inputs (4 tensors of h) and two dropout masks: replicated over TP
    # unless sequence parallelism shards them along the sequence.
    replicated = sb * m.hidden * (4 * e + 2 * mask) / (t if layout.sp else 1)
    # Q, K, V, the attention output (the out-projection's input), the MLP's activation input and output
    kv = kv_heads_per_rank(m, t) * d
    mlp = (3 if m.gated else 2) * f / t
    parallel = sb * e * (m.hidden / t + 2 * kv + m.hidden / t + mlp)
    heads = m.heads // t
    if job.engine.flash_attention:
        scores = sb * heads * 4                 # fp32 log-sum-exp per row, the s*s matrix is never stored
    else:                                       # softmax output, dropout mask and dropout output
        scores = heads * layout.mb * job.seq_len**2 * (e + (mask + e if m.dropout else 0))
    return {"replicated (norm inputs, masks)": replicated, "tensor-parallel (QKV, attn, MLP)": parallel,
            "attention scores": scores}


def layer_activation_bytes(job, layout):
    """Bytes one layer keeps per micro-batch under the layout's recomputation."""
    terms = layer_activation_terms(job, layout)
    if layout.recompute == "full":
        return job.seq_len * layout.mb * job.model.hidden * job.elem_bytes / (layout.tp if layout.sp else 1)
    if layout.recompute == "selective" and not job.engine.flash_attention:
        return sum(terms.values()) - terms["attention scores"]
    return sum(terms.values())


def analytic_inflight(schedule, p, m, v, stage):
    """Chunk-forwards a stage holds at its peak: GPipe all, 1F1B p - stage (PipeDream-Flush),
    interleaved Megatron's warm-up count 2*(p - stage - 1) + (v - 1)*p, plus the one in progress."""
    if schedule == "gpipe":
        return m * v
    if schedule == "interleaved":
        return min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1)
    return min(m, p - stage)


def stage_memory(job, layout, stage, inflight):
    """Memory terms (bytes) on one rank of ``stage`` holding ``inflight`` chunk-forwards at its peak."""
    m, lay, e = job.model, layout, job.elem_bytes
    params = stage_params(job, lay, stage)
    w, g, o = state_bytes_per_param(job, lay.zero1, lay.dp)
    layers = stage_layers(m.layers, lay.pp)[stage]
    per_layer = layer_activation_bytes(job, lay)
    chunk = per_layer * layers / lay.v
    terms = {"weights": params * w, "gradients": params * g, "optimizer state": params * o,
             "activations": chunk * inflight}
    if lay.recompute == "full":   # the layer being back-propagated holds its full set again
        full = sum(layer_activation_terms(job, lay).values())
        terms["recompute working set"] = full
    sbh = job.seq_len * lay.mb * m.hidden / (lay.tp if lay.sp else 1)
    if stage == 0 and m.dropout:   # the embedding's dropout mask, per micro-batch in flight
        terms["embedding dropout"] = sbh * MASK_BYTES * inflight
    if stage == lay.pp - 1:        # final norm input, head input, fp32 logits of the micro-batch in backward
        terms["head and logits"] = 2 * sbh * e + 4 * job.seq_len * lay.mb * m.vocab / lay.tp
    return terms


def memory_per_stage(job, layout, inflight=None):
    """Total bytes per rank for every stage; ``inflight`` per stage (default: analytic)."""
    p, mb = layout.pp, job.micro_batches(layout)
    if inflight is None:
        inflight = [analytic_inflight(layout.schedule, p, mb, layout.v, i) for i in range(p)]
    return [sum(stage_memory(job, layout, i, inflight[i]).values()) for i in range(p)]
