"""Ring attention over a cp group: the attention core when each rank holds a part of the sequence.

Forward, on rank r of n (blocks and merging: hpcpar/ops/ring_attention.py):

    step 0:      start sending my [K | V] to r+1 and receiving r-1's;  attend to my own block
    step s:      wait for the block that arrived (it started at rank r-s); pass it on to r+1 while
                 attending to it; merge the partial result into O and lse (online softmax)
    n-1 hops in all; the block computes while the next one travels.

Backward: the [K | V] blocks go round again (each rank recomputes its blocks' probabilities from the
saved lse), and each block's dK/dV accumulator travels with it, one step behind:

    step s:      dQ += my queries' share from block r-s (stays here);
                 acc(r-s) = (what rank r-1 added to it, received) + my share;  send acc to r+1
    after step n-1 the accumulator arriving from r-1 is my own block's, complete: dK, dV.

With documents or a sliding window (``attn_mask``, ops/masks.py's rule) a block that holds no key any
of my queries sees is skipped - it still travels, for the ranks after me - and one that holds some is
trimmed to them (ops/ring_attention.py); the ranks' positions are then the micro-batch's own deal
(``ctx.cp_positions``, ``document_balance``), not necessarily the causal balance.

So n hops of dK/dV and n-1 of K/V; every transfer is non-blocking (Isend/Irecv through the counted
communicator) and is in flight while a block computes.  The trace shows each hop on the "cp" track and
each block on the compute track (``tracer.span``); waits that were not hidden land on "comm".
"""
import time

from hpcpar import tracer as trace
from hpcpar.backend import array_module
from hpcpar.comm import wait_all
from hpcpar.nn.attention_core import recorder
from hpcpar.ops.gqa import repeat_kv_backward, repeat_kv_forward
from hpcpar.ops.ring_attention import block_backward, block_forward, cp_positions, merge, ring_source, scale

KV_TAG, DKV_TAG = 41, 42


class Hop:
    """One ring hop in flight: ``buf`` goes to the next rank, the previous rank's array of the same
    shape comes in (``wait`` returns it)."""

    def __init__(self, comm, buf, tag, what):
        n, r = comm.size, comm.rank
        self.what, self.started = what, time.perf_counter()
        self.incoming = array_module(buf).empty(buf.shape, dtype=buf.dtype)
        self.requests = [comm.irecv_(self.incoming, (r - 1) % n, tag), comm.isend(buf, (r + 1) % n, tag)]

    def wait(self):
        start = time.perf_counter()
        wait_all(self.requests)
        tracer = trace.active()
        if tracer is not None:
            end = time.perf_counter()
            tracer.span(self.what, "ring", self.started, end, "cp")
            tracer.span(f"cp wait {self.what}", "ring-wait", start, end, "comm")
        return self.incoming


def pair(a, b):
    """[a | b] as one contiguous (2, *a.shape) array: one message instead of two."""
    out = array_module(a).empty((2,) + a.shape, dtype=a.dtype)
    out[0], out[1] = a, b
    return out


def _block(what, fn, *args):
    """fn(*args), shown on the compute track when tracing."""
    tracer = trace.active()
    if tracer is None:
        return fn(*args)
    with tracer.region(what, "ring-attention"):
        return fn(*args)


class RingAttention:
    """The attention core over the ranks of ``comm`` (a cp group); the interface of
    nn/attention_core.LocalAttention.  It keeps no probabilities whatever ``selective`` says: its backward
    recomputes them block by block anyway.  No dropout on them (the configuration refuses it)."""

    logits = None           # QK-clip's (NH,) largest logits (nn/attention_core.recorder)

    def __init__(self, comm):
        self.comm = comm

    def forward(self, q, k, v, mask, selective, ctx, rep=1, attn_mask=None):
        """q (B, NH, T/cp, HS), k, v (B, NH/rep, T/cp, HS) of this rank's tokens -> O (B, NH, T/cp, HS), cache.
        Grouped K/V are repeated to NH heads before the ring: its blocks are full heads."""
        pos = cp_positions(ctx, q.shape[2], self.comm.size)
        qs = scale(q)                                                        # Qs = Q / sqrt(HS)
        k, v = repeat_kv_forward(k, rep), repeat_kv_forward(v, rep)
        o, lse = self.ring_forward(qs, k, v, pos, attn_mask, recorder(self, ctx))
        return o, (qs, k, v, o, lse, pos, rep, attn_mask)

    def ring_forward(self, qs, k, v, pos, attn_mask=None, logits=None):
        """O (B, NH, T/cp, HS) and lse (B, NH, T/cp) of this rank's queries over every rank's block, the
        blocks passed round the ring (what `hpcpar train --plug` lets a student write: training/plug.py)."""
        n, r = self.comm.size, self.comm.rank
        kv = pair(k, v)                                                      # (2, B, NH, T/cp, HS)
        o = lse = None
        for step in range(n):
            j = ring_source(r, step, n)
            hop = Hop(self.comm, kv, KV_TAG, f"kv {j}->{(r + 1) % n}") if step < n - 1 else None
            part = _block(f"attn q{r} kv{j}", block_forward, qs, kv[0], kv[1], pos[r], pos[j], attn_mask, logits)
            o, lse = part if o is None else merge(o, lse, *part)             # (B, NH, T/cp, HS), (B, NH, T/cp)
            if hop is not None:
                kv = hop.wait()
        return o, lse

    def backward(self, do, cache, out=None):
        """do (B, NH, T/cp, HS) -> dq, dk, dv (B, NH/rep, T/cp, HS) (written into ``out``, three arrays,
        if given)."""
        qs, k, v, o, lse, pos, rep, attn_mask = cache
        n, r = self.comm.size, self.comm.rank
        xp = array_module(do)
        delta = (do * o).sum(axis=-1)                                        # D = rowsum(dO * O)  (B, NH, T/cp)
        dqs = xp.zeros(qs.shape, dtype=qs.dtype)
        kv, dkv_hop = pair(k, v), None
        for step in range(n):
            j = ring_source(r, step, n)
            kv_hop = Hop(self.comm, kv, KV_TAG, f"kv {j}->{(r + 1) % n}") if step < n - 1 else None
            dq_b, dk_b, dv_b = _block(f"attn grad q{r} kv{j}", block_backward, do, delta, qs, kv[0], kv[1],
                                      pos[r], pos[j], lse, attn_mask)
            dqs += dq_b
            acc = pair(dk_b, dv_b)                                           # (2, B, NH, T/cp, HS): block j's
            if dkv_hop is not None:
                acc += dkv_hop.wait()                                        # ... plus ranks j .. r-1's shares
            dkv_hop = Hop(self.comm, acc, DKV_TAG, f"dkv {j}->{(r + 1) % n}")
            if kv_hop is not None:
                kv = kv_hop.wait()
        dkv = dkv_hop.wait()                                                 # my block, from every rank
        dq, dk, dv = out if out is not None else (xp.empty(qs.shape, dtype=qs.dtype), None, None)
        dq[...] = scale(dqs)                                                 # dQ = dQs / sqrt(HS)
        if out is None:
            return dq, repeat_kv_backward(dkv[0], rep), repeat_kv_backward(dkv[1], rep)
        dk[...], dv[...] = dkv[0], dkv[1]
        return dq, dk, dv
