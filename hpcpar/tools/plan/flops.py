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

Multi-head latent attention (DeepSeek-V3) replaces qkv: the down-projections whole on every rank, the
up-projections cut by heads (rq the queries' latent, r the keys' and values' plus dr the rotary key):

    q down     (b*s) x h        @ h x rq              q up   (b*s) x rq  @ rq x a*d/t     (or q: h x a*d/t)
    kv down    (b*s) x h        @ h x (r + dr)        kv up  (b*s) x r   @ r x a*(dn + dv)/t
    and the context and attention output of value heads dv wide.

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


def projection_gemms(model, tokens, tp):
    """The GEMMs that make a layer's q, k and v (module docstring)."""
    h, d, heads = model.hidden, model.head_dim, model.heads // tp
    if not model.kv_lora_rank:
        return [Gemm("qkv", tokens, model.attention_width // tp + 2 * kv_heads_per_rank(model, tp) * d, h)]
    rq, r, dr = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_dim
    q = [Gemm("q down", tokens, rq, h), Gemm("q up", tokens, heads * d, rq)] if rq else [Gemm("q", tokens, heads * d, h)]
    return q + [Gemm("kv down", tokens, r + dr, h), Gemm("kv up", tokens, heads * (d - dr + model.v_head_dim), r)]


def layer_gemms(model, b, s, tp, cp=1, keys=None, layer=None):
    """The forward GEMMs of transformer layer ``layer`` (None: one with the model's MLP or experts) for b
    sequences on one of tp ranks; with context parallelism a rank holds s/cp queries of each sequence and
    meets all s keys (ring attention) - or ``keys`` of them, a packed window's documents'
    (shape.attention_span, summed over its documents).  A mixture of experts runs the router, then each
    token through its top_k routed experts (k rows a token) and the shared experts (one MLP
    shared_experts * ffn wide) - whole on every TP rank, which routes its 1/tp of the tokens (the
    sequence parallelism the planner asks for with experts); its first ``dense_layers`` layers have a
    dense MLP of ``dense_ffn``."""
    h, d, f, dv = model.hidden, model.head_dim, model.ffn, model.v_head_dim
    tokens, heads, q = b * s // cp, model.heads // tp, s // cp
    keys = s if keys is None else keys

    def mlp(rows, width, name="mlp", cut=tp):
        return [Gemm(f"{name} up", rows, (2 if model.gated else 1) * width // cut, h),
                Gemm(f"{name} down", rows, h, width // cut)]

    gemms = projection_gemms(model, tokens, tp) + [
        Gemm("scores", q, keys, d, count=b * heads, weight=False),
        Gemm("context", q, dv, keys, count=b * heads, weight=False),
        Gemm("attn out", tokens, h, heads * dv),
    ]
    if layer is not None and layer < model.dense_layers:
        return gemms + mlp(tokens, model.dense_ffn)
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
    total = 3 * logits_gemm(model, batch, s, 1).flops
    for layer in range(model.layers):
        gemms = layer_gemms(model, batch, s, 1, keys=keys, layer=layer)
        layer_fwd = sum(g.flops for g in gemms)
        extra = {"none": 0, "selective": sum(g.flops for g in gemms if not g.weight), "full": layer_fwd}[recompute]
        total += 3 * layer_fwd + extra
    return total


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
