"""Context parallelism: the ranks of a cp group each hold a part of every sequence.

Everything but attention works token by token, so it runs unchanged on a rank's tokens; attention
needs every earlier token's key and value, so it becomes ring attention (key/value blocks travel
round the cp ring while each rank computes with the block it has) or Ulysses attention (two
all-to-alls trade the sequence cut for a head cut around the ordinary core): docs/context_parallel.md.

ring.py          RingAttention: the attention core over the ring, forward and backward, non-blocking
ulysses.py       UlyssesAttention: the one-rank core between two all-to-alls, forward and backward
transpose.py     Ulysses' transposes, sequence cut <-> head cut, as pure functions
parallelize.py   the checks that refuse a bad cp size, swapping in the chosen core
The math (blockwise attention, online softmax, the causal balance) is hpcpar/ops/ring_attention.py.
"""
from hpcpar.context_parallel.parallelize import check_context_parallel, parallelize_context

__all__ = ["check_context_parallel", "parallelize_context"]
