"""Context parallelism around the model: the checks that refuse a bad size, swapping in the ring core.

Rank r of a cp group holds chunks r and 2cp-1-r of every sequence (ops/ring_attention.py,
``balanced_positions``; train.py cuts the inputs and targets), so the loss on its tokens is a part of
the sum over the sequence, and the usual 1 / (tokens in the batch) normalisation stays exact.
"""
from hpcpar.context_parallel.ring import RingAttention
from hpcpar.runtime import UsageError


def check_context_parallel(cp, seq_len, tp=1, sequence_parallel=False):
    """Refuse a sequence that does not cut into cp ranks' equal chunks - before any rank communicates."""
    if cp == 1:
        return
    if seq_len % (2 * cp):
        raise UsageError(f"--cp {cp}: the sequence length {seq_len} must divide into 2 x cp = {2 * cp} "
                         f"equal chunks (each rank holds one early and one late chunk)")
    if sequence_parallel and (seq_len // cp) % tp:
        raise UsageError(f"--sequence-parallel with --cp {cp}: --tp {tp} must divide each rank's "
                         f"{seq_len // cp} tokens")


def parallelize_context(stage, comm):
    """Give every attention layer of ``stage`` the ring core over ``comm``. Returns ``stage``."""
    if comm.size > 1:
        for block in stage.blocks:
            if hasattr(block, "attn"):                   # a transformer block
                block.attn.core = RingAttention(comm)
    return stage
