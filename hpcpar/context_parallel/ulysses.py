"""Ulysses attention over a cp group: the attention core when each rank holds a part of the sequence,
by two all-to-alls around the ordinary core (the transposes: transpose.py).

Forward, on rank r of n (NH query and NKV key/value heads on this tp rank, both divisible by n):

    Q, K, V (B, NH|NKV, T/n, HS)  --all-to-all-->  (B, NH/n | NKV/n, T, HS)   my heads, every token
    O_h = attention(Q_h, repeat_kv(K_h), repeat_kv(V_h))                      the one-rank core, whole sequences
    O_h (B, NH/n, T, HS)          --all-to-all-->  O (B, NH, T/n, HS)         back to my tokens

Backward, the conjugate: dO to heads, the core's backward, [dQ | dK | dV] back to tokens (K/V grouped:
the repeat's backward sums each group before its gradients travel).  Four all-to-alls per layer and
micro-batch, each handing MPI a buffer of B (T/n) HS x (heads moved) elements:

    forward  (NH + 2 NKV) + NH,   backward  NH + (NH + 2 NKV)   ->   4 B (T/n) HS (NH + NKV) elements

(``ulysses_bytes``; the ring's are ring.py's.)  Every all-to-all is a span on the "cp" track carrying
its bytes; the positions of this rank's tokens are training/batches.py's (the causal balance, or with documents the
micro-batch's deal), put back in sequence order by the transpose - where the core sees the whole window
in order and applies ops/masks.py's rule (documents, window) as one rank would.
"""
import time

from hpcpar.context_parallel.transpose import seq_to_heads_backward, seq_to_heads_forward
from hpcpar.nn.attention_core import core_backward, core_forward, recorder
from hpcpar.ops.gqa import repeat_kv_backward, repeat_kv_forward
from hpcpar.ops.ring_attention import cp_positions
from hpcpar import tracer as trace


def ulysses_bytes(batch, seq_len, cp, head_size, heads, kv_heads, itemsize):
    """Bytes one cp rank hands the all-to-alls per attention layer and micro-batch (forward and backward)."""
    return 4 * batch * (seq_len // cp) * head_size * (heads + kv_heads) * itemsize


class UlyssesAttention:
    """The attention core over the ranks of ``comm`` (a cp group); the interface of
    nn/attention_core.LocalAttention, whose functions it calls on the whole sequence of its heads."""

    logits = None           # QK-clip's (NH,) largest logits: this rank fills its heads' (nn/attention_core.recorder)

    def __init__(self, comm):
        self.comm = comm

    def _exchange(self, what):
        """The cp group's all-to-all, a span on the "cp" track with its bytes when tracing."""
        def all_to_all(message):
            start = time.perf_counter()
            out = self.comm.all_to_all(message)
            tracer = trace.active()
            if tracer is not None:
                tracer.span(f"a2a {what}", "ulysses", start, time.perf_counter(), "cp", bytes=message.nbytes)
            return out
        return all_to_all

    def forward(self, q, k, v, mask, selective, ctx, rep=1, attn_mask=None):
        """q (B, NH, T/cp, HS), k, v (B, NH/rep, T/cp, HS) of this rank's tokens -> O (B, NH, T/cp, HS), cache."""
        pos = cp_positions(ctx, q.shape[2], self.comm.size)
        qh, kh, vh = seq_to_heads_forward([q, k, v], pos, self._exchange("qkv"))   # (B, NH/cp | NKV/cp, T, HS)
        h = qh.shape[1]                                                            # heads a cp rank takes
        oh, c_core = core_forward(qh, repeat_kv_forward(kh, rep), repeat_kv_forward(vh, rep), mask, selective,
                                  attn_mask, recorder(self, ctx, slice(self.comm.rank * h, (self.comm.rank + 1) * h)))
        (o,) = seq_to_heads_backward([oh], pos, self._exchange("o"))             # (B, NH, T/cp, HS)
        return o, (c_core, pos, rep)

    def backward(self, do, cache, out=None):
        """do (B, NH, T/cp, HS) -> dq, dk, dv (written into ``out``, three arrays, if given)."""
        c_core, pos, rep = cache
        (doh,) = seq_to_heads_forward([do], pos, self._exchange("do"))           # (B, NH/cp, T, HS)
        dqh, dkh, dvh = core_backward(doh, c_core)
        grads = seq_to_heads_backward([dqh, repeat_kv_backward(dkh, rep), repeat_kv_backward(dvh, rep)], pos,
                                      self._exchange("dqkv"))                     # (B, NH | NH/rep, T/cp, HS)
        if out is None:
            return tuple(grads)
        for target, g in zip(out, grads):
            target[...] = g
        return tuple(out)
