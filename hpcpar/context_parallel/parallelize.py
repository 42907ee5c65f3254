"""Context parallelism around the model: the checks that refuse a bad size, swapping in the cp core.

Rank r of a cp group holds chunks r and 2cp-1-r of every sequence (ops/ring_attention.py,
``balanced_positions``; training/batches.py cuts the inputs and targets), so the loss on its tokens is a part of
the sum over the sequence, and the usual 1 / (tokens in the batch) normalisation stays exact.  Both
kinds take the same cut: the ring because it balances the causal work, Ulysses because its transpose
puts any cut back in sequence order.
"""
from hpcpar.context_parallel.ring import RingAttention
from hpcpar.context_parallel.ulysses import UlyssesAttention
from hpcpar.runtime import UsageError

CORES = {"ring": RingAttention, "ulysses": UlyssesAttention}     # --cp-kind: the attention core over a cp group


def check_context_parallel(cp, seq_len, tp=1, sequence_parallel=False, kind="ring", heads=0, kv_heads=0):
    """Refuse a sequence that does not cut into cp ranks' equal chunks, and under Ulysses a tp rank's query
    or key/value heads that do not cut into cp equal parts - before any rank communicates."""
    if cp == 1:
        return
    if seq_len % (2 * cp):
        raise UsageError(f"--cp {cp}: the sequence length {seq_len} must divide into 2 x cp = {2 * cp} "
                         f"equal chunks (each rank holds one early and one late chunk)")
    if sequence_parallel and (seq_len // cp) % tp:
        raise UsageError(f"--sequence-parallel with --cp {cp}: --tp {tp} must divide each rank's "
                         f"{seq_len // cp} tokens")
    if kind == "ulysses":
        for what, n in (("attention heads", heads), ("key/value heads", kv_heads)):
            if (n // tp) % cp:
                per = f"the {n} {what}" + (f" / tp {tp} = {n // tp} per tp rank" if tp > 1 else "")
                raise UsageError(f"--cp-kind ulysses --cp {cp}: {per} must divide by cp (each cp rank attends "
                                 f"with an equal share of them)")


def parallelize_context(stage, comm, kind="ring"):
    """Give every attention layer of ``stage`` the ``kind`` core over ``comm``. Returns ``stage``."""
    if comm.size > 1:
        for block in stage.transformer_blocks():
            if hasattr(block, "attn"):                   # a transformer block
                block.attn.core = CORES[kind](comm)
    return stage
