"""The attention core as both attention modules call it (GPT-2's and Llama's), keeping its
probabilities for the backward or not.

Selective activation recomputation (Korthikanti et al. 2022; Megatron-LM's selective granularity):
of a block's activations, the attention probabilities P (B, NH, T, T) and the dropout mask beside
them grow with T^2 while all the others grow with T - and they are the cheapest to rebuild: no
weights, one batched GEMM (Q K^T) and a softmax.  So the core can keep only its inputs and run its
forward again in the backward; the dropout mask is drawn again, identically (its key is (seed, step,
site, sample): nn/dropout.py), so the gradients are bit for bit those of keeping everything.

    kept after the forward     everything               selective
    this core                  q/sqrt(HS), k, v, P, D   q, k, v (which the block holds anyway)
    memory per layer           ~3 B T C + B NH T^2 (x2 with dropout)     ~3 B T C
    extra compute              none                     Q K^T, softmax, P V once more

Full recomputation (nn/block.py ``recompute``) goes further: a block keeps only its input.

Documents and sliding windows change which keys a query sees, nothing else: ``attention_mask`` makes
ops/masks.py's rule for the micro-batch (its documents, ``ctx.docs``) and the layer (its window), and
each core hands it on to its blocks.

Each attention module holds its core as an object (``LocalAttention`` below), so that context
parallelism can swap in ring or Ulysses attention (hpcpar/context_parallel/ring.py, ulysses.py: the
same two methods) and keep everything around it.  The core takes grouped-query K/V as they are
(``rep`` = NH / NKV query heads per K/V head) and repeats them itself: Ulysses moves the NKV heads,
not the NH repeated ones.
"""
from typing import Any, Callable, NamedTuple

from hpcpar.ops.attention import attention_backward, attention_forward
from hpcpar.ops.gqa import repeat_kv_backward, repeat_kv_forward
from hpcpar.ops.masks import Mask


class CoreInputs(NamedTuple):
    """What the core keeps under selective recomputation."""
    q: Any                  # (B, NH, T, HS), unscaled
    k: Any
    v: Any
    mask: Callable          # () -> the dropout mask (B, NH, T, T), or None
    attn_mask: Any = None   # the rule (ops/masks.Mask), or None: causal


def attention_mask(ctx, window=0):
    """The rule for this micro-batch (its documents) and layer (its sliding window), or None: causal."""
    docs = getattr(ctx, "docs", None)
    return None if docs is None and not window else Mask(docs, window)


def core_forward(q, k, v, mask, selective=False, attn_mask=None, logits=None):
    """q, k, v (B, NH, T, HS), mask () -> dropout mask or None -> o (B, NH, T, HS), cache; ``logits``
    (NH,) takes each head's largest score (ops/attention.py)"""
    o, cache = attention_forward(q, k, v, mask(), None, attn_mask, logits)     # block None: the engine's
    return o, (CoreInputs(q, k, v, mask, attn_mask) if selective else cache)


def core_backward(do, cache, out=None):
    """do (B, NH, T, HS) -> dq, dk, dv; a selective cache runs the forward again first."""
    if isinstance(cache, CoreInputs):
        cache = attention_forward(cache.q, cache.k, cache.v, cache.mask(), None, cache.attn_mask)[1]
    return attention_backward(do, cache, out=out)


def recorder(core, ctx, heads=slice(None)):
    """Where a core records its heads' largest pre-softmax logits in this forward: its ``logits`` array
    (the attention module's heads on this rank; QK-clip sets it, training/qk_clip.py), ``heads`` of it,
    in training only - None otherwise."""
    if core.logits is None or ctx is None or not ctx.training:
        return None
    return core.logits[heads]


class LocalAttention:
    """The core over the whole sequence held on this rank: ``core_forward`` / ``core_backward``."""

    logits = None           # QK-clip: (NH,) each head's largest logit this step (``recorder``)

    def forward(self, q, k, v, mask, selective, ctx, rep=1, attn_mask=None):
        """q (B, NH, T, HS), k, v (B, NH/rep, T, HS) -> o (B, NH, T, HS), cache"""
        o, cache = core_forward(q, repeat_kv_forward(k, rep), repeat_kv_forward(v, rep), mask, selective, attn_mask,
                                recorder(self, ctx))
        return o, (cache, rep)

    def backward(self, do, cache, out=None):
        """do (B, NH, T, HS) -> dq (B, NH, T, HS), dk, dv (B, NH/rep, T, HS); ``out`` only when rep is 1."""
        cache, rep = cache
        dq, dk, dv = core_backward(do, cache, out)
        return dq, repeat_kv_backward(dk, rep), repeat_kv_backward(dv, rep)
