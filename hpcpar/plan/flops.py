"""FLOPs: every matrix multiply of one transformer layer, and the closed forms they add up to.

A GEMM (m x k) @ (k x n) costs 2*m*n*k FLOPs.  Forward, per layer and micro-batch of b sequences of s
tokens, on one of t tensor-parallel ranks (Megatron splits QKV and MLP-up by columns, attention output
and MLP-down by rows, heads across ranks):

    qkv        (b*s) x h        @ h x (h + 2*kv*d)/t
    scores     per head: s x d  @ d x s               (b * a/t heads)
    context    per head: s x s  @ s x d
    attn out   (b*s) x h/t      @ h/t x h
    mlp up     (b*s) x h        @ h x f/t             (2f/t for a gated MLP)
    mlp down   (b*s) x f/t      @ f/t x h
    logits     (b*s) x h        @ h x V/t             (last stage only)

Backward does two GEMMs of the same size per forward one: dX (on the critical path, "B") and dW
("W", the part zero-bubble schedules defer); the attention-core GEMMs have no weights, so both of
their backward GEMMs are dX work.  Summed over a GPT model (kv = a, f = 4h, t = 1) forward + backward
gives Narayanan et al. 2021's count per step of B sequences:

    72 * B*s*l*h^2 * (1 + s/(6h) + V/(12*l*h))     and with full recomputation (forward twice)
    96 * B*s*l*h^2 * (1 + s/(6h) + V/(16*l*h))
"""
from hpcpar.flops import Gemm
from hpcpar.runtime import UsageError
from hpcpar.shape import attention_span


def kv_heads_per_rank(model, tp):
    """Key/value heads on one TP rank; with tp > kv they are replicated (one per rank)."""
    return max(model.kv_heads // tp, 1)


def layer_gemms(model, b, s, tp, cp=1, keys=None):
    """The forward GEMMs of one transformer layer for b sequences on one of tp ranks; with context
    parallelism a rank holds s/cp queries of each sequence and meets all s keys (ring attention) - or
    ``keys`` of them, a packed window's documents' (shape.attention_span, summed over its documents).  A
    mixture of experts runs the router, then each token through its top_k routed experts (k rows a
    token) and the shared experts (one MLP shared_experts * ffn wide) - whole on every TP rank, which
    routes its 1/tp of the tokens (the sequence parallelism the planner asks for with experts)."""
    h, d, f = model.hidden, model.head_dim, model.ffn
    tokens, heads, q = b * s // cp, model.heads // tp, s // cp
    keys = s if keys is None else keys
    qkv = model.attention_width // tp + 2 * kv_heads_per_rank(model, tp) * d

    def mlp(rows, width, name="mlp", cut=tp):
        return [Gemm(f"{name} up", rows, (2 if model.gated else 1) * width // cut, h),
                Gemm(f"{name} down", rows, h, width // cut)]

    gemms = [
        Gemm("qkv", tokens, qkv, h),
        Gemm("scores", q, keys, d, count=b * heads, weight=False),
        Gemm("context", q, d, keys, count=b * heads, weight=False),
        Gemm("attn out", tokens, h, model.attention_width // tp),
    ]
    if not model.experts:
        return gemms + mlp(tokens, f)
    routed = tokens // tp
    gemms += [Gemm("router", routed, model.experts, h)] + mlp(routed * model.top_k, f, "moe", cut=1)
    return gemms + (mlp(routed, model.shared_experts * f, "shared", cut=1) if model.shared_experts else [])


def logits_gemm(model, b, s, tp, cp=1):
    return Gemm("logits", b * s // cp, model.vocab // tp, model.hidden)


def step_flops(model, batch, s, recompute="none", keys=None):
    """FLOPs of one training step over ``batch`` sequences, counted on the unsplit model.

    Model FLOPs (recompute "none") are what MFU divides by; hardware FLOPs add the recomputed
    forward passes (all GEMMs of every layer for "full", the attention core for "selective").
    """
    layer_fwd = sum(g.flops for g in layer_gemms(model, batch, s, 1, keys=keys))
    core_fwd = sum(g.flops for g in layer_gemms(model, batch, s, 1, keys=keys) if not g.weight)
    extra = {"none": 0, "selective": core_fwd, "full": layer_fwd}[recompute]
    return model.layers * (3 * layer_fwd + extra) + 3 * logits_gemm(model, batch, s, 1).flops


def narayanan_flops(batch, s, layers, hidden, vocab, recompute=False):
    """The closed form of Narayanan et al. 2021 (their appendix), for a GPT model."""
    if recompute:
        return 96 * batch * s * layers * hidden**2 * (1 + s / (6 * hidden) + vocab / (16 * layers * hidden))
    return 72 * batch * s * layers * hidden**2 * (1 + s / (6 * hidden) + vocab / (12 * layers * hidden))


def packed_keys(seq_len, doc_len, window):
    """The keys a query meets in a sequence of documents of ``doc_len`` (0: one) under a ``window`` (0:
    none), rounded to a whole key: hpcpar/shape.py's attention_span, or 0 for the whole sequence."""
    if doc_len < 0 or window < 0:
        raise UsageError("--doc-len and --window must not be negative")
    if not doc_len and not window:
        return 0
    doc_len = min(doc_len or seq_len, seq_len)
    lengths = [doc_len] * (seq_len // doc_len) + ([seq_len % doc_len] if seq_len % doc_len else [])
    return max(1, round(attention_span(lengths, window)))
