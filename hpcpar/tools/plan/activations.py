"""Activations one layer keeps per micro-batch on one rank, term by term (the planner's memory.py adds
them up per stage, times the micro-batches its schedule keeps in flight).  16-bit, Korthikanti et al.
2022, section 4:

    no parallelism        s*b*h*(34 + 5*a*s/h)  bytes
    tensor parallel       s*b*h*(10 + 24/t + 5*a*s/(h*t))
    + sequence parallel   s*b*h*(34 + 5*a*s/h) / t
    selective recompute   drops the 5*a*s/h term (the attention scores are recomputed); PyTorch's
                          op-level policy (engine.selective_ops) keeps the layer input, the attention
                          output and every second GEMM output instead
    full recompute        keeps only each layer's input, 2*s*b*h (/t with sp), plus one layer's full
                          set while that layer's backward runs

counted here from the stored tensors themselves, so other shapes follow (GQA, gated MLPs, fp32/fp64
engines, no dropout, hpcpar's extra scaled-Q and SwiGLU caches); context parallelism divides s by cp.
"""
from hpcpar.ops.attention import causal_work
from hpcpar.tools.plan import experts
from hpcpar.tools.plan.flops import kv_heads_per_rank

MASK_BYTES = 1    # a dropout mask element


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
    kv, a = kv_heads_per_rank(m, t) * d, m.attention_width / t      # a: heads * head_dim / t
    mlp = 0 if m.experts else (3 if m.gated else 2) * f / t     # a mixture of experts: its own term
    parallel = sb * e * (a + 2 * kv + a + mlp)
    if job.engine.numpy_caches:
        # hpcpar also keeps the scaled Q, and a gated MLP SwiGLU's sigmoid (ops/swiglu.py); a GELU MLP
        # keeps its derivative in place of its pre-activation, so no more than the two counted above
        parallel += sb * e * (a + (f / t if m.gated and not m.experts else 0))
    heads = m.heads // t
    if job.engine.flash_attention:
        scores = sb * heads * 4                 # fp32 log-sum-exp per row, the s*s matrix is never stored
    else:                                       # softmax output, dropout mask and dropout output
        kept = causal_work(job.seq_len) if job.engine.causal_blocks else 1.0    # P's share of s*s
        scores = heads * sb * job.seq_len * (e * kept + (mask + e if m.dropout else 0))
    terms = {"replicated (norm inputs, masks)": replicated, "tensor-parallel (QKV, attn, MLP)": parallel,
             "attention scores": scores}
    if m.experts:
        terms["experts (rows, router)"] = experts.activation_bytes(m, layout, sb, e, job.engine.numpy_caches)
    return terms


def op_level_selective_bytes(job, layout):
    """PyTorch's op-level selective checkpointing (torchtitan): a layer keeps its input, the attention
    output with its log-sum-exp and every second GEMM output; the rest is recomputed from them.  A
    mixture of experts' layer is counted whole (experts.activation_bytes): an upper bound, the policy's
    choices inside it are not modelled."""
    m, t = job.model, layout.tp
    seq_split = t if layout.sp else 1
    # per rank: q, k, v and the MLP's up (and gate) projections column-parallel; the attention output
    # projection and the MLP's down projection full width, split along the sequence with sp
    mlp = 0 if m.experts else (2 if m.gated else 1) * m.ffn / t + m.hidden / seq_split
    outputs = m.attention_width / t + 2 * kv_heads_per_rank(m, t) * m.head_dim + m.hidden / seq_split + mlp
    kept = m.hidden / seq_split + m.attention_width / t + outputs / 2
    sb = tokens_per_rank(job, layout)
    moe = experts.activation_bytes(m, layout, sb, job.elem_bytes, job.engine.numpy_caches) if m.experts else 0
    return sb * (kept * job.elem_bytes + m.heads // t * 4) + moe


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
