"""Tensor parallelism (Megatron-LM): each layer's matrix multiply shared by the ranks of a TP group.

regions.py        the conjugate operators: what each cut costs, forward and backward, named once
layers.py         ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, VocabParallelLMHead
cross_entropy.py  the loss over a vocabulary split across ranks, without gathering the logits
parallelize.py    turn a serial model stage into its tensor-parallel version, parameter by parameter
"""
from hpcpar.tensor_parallel.parallelize import parallelize

__all__ = ["parallelize"]
