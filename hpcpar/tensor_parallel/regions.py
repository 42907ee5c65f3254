"""The conjugate region operators.  Every tensor-parallel layer is a local GEMM between two of these.

A rank group that shares a layer moves between two kinds of "region": *replicated* (every rank holds
the same full activation) and *parallel* (each rank holds its own part - a slice of the columns, or a
partial sum).  Each crossing has a forward rule and, by the chain rule, a conjugate backward rule:

    operator                        forward              backward
    copy_to_region       (f)        identity             all-reduce        before a column-parallel GEMM
    reduce_from_region   (g)        all-reduce           identity          after a row-parallel GEMM
    gather_from_region              all-gather (last)    split (last)      gather a column-parallel output
    scatter_to_region               split (last)         all-gather (last)
    gather_from_sequence            all-gather (seq)     reduce-scatter    sequence parallelism: before
    reduce_scatter_to_sequence      reduce-scatter (seq) all-gather (seq)  ... and after the GEMMs

Why f's backward is an all-reduce: the replicated input x feeds every rank's slice, y_i = x W_i, so
dL/dx = sum_i dL/dy_i W_i^T - a sum of every rank's contribution.  Why g's backward is the identity:
y = sum_i y_i, so dL/dy_i = dL/dy, which every rank already holds.  Sequence parallelism (Korthikanti
et al. 2022) splits g into reduce-scatter + all-gather along the sequence, so the LayerNorms and
dropouts between the GEMMs work on 1/tp of the tokens: same bytes on the wire as the all-reduce (which
is exactly a reduce-scatter followed by an all-gather), 1/tp of the activation memory there.

Activations are (B, T, C): the sequence axis is 1, the feature axis is last.
"""
from dataclasses import dataclass
from typing import Callable

from hpcpar.precision import scattered_in_fp32, summed_in_fp32

SEQ = 1


def _split_last(comm, x):
    k = x.shape[-1] // comm.size
    return x[..., comm.rank * k:(comm.rank + 1) * k]


@dataclass(frozen=True)
class RegionOp:
    name: str
    forward: Callable      # (comm, x) -> y
    backward: Callable     # (comm, dy) -> dx


def _sum(c, x):
    return summed_in_fp32(c.all_reduce_, x)


def _sum_scatter(c, x):
    return scattered_in_fp32(lambda y: c.reduce_scatter(y, axis=SEQ), x)


# The all-reduces run in place: every caller hands over a fresh temporary it owns (a partial product,
# an input gradient), and reducing into it spares allocating - and page-faulting - a new output.
# Low-precision activations are summed in fp32 (hpcpar/precision.py).
copy_to_region = RegionOp("copy_to_region (f)", lambda c, x: x, _sum)
reduce_from_region = RegionOp("reduce_from_region (g)", _sum, lambda c, dy: dy)
gather_from_region = RegionOp("gather_from_region", lambda c, x: c.all_gather(x, axis=x.ndim - 1),
                              _split_last)
scatter_to_region = RegionOp("scatter_to_region", _split_last,
                             lambda c, dy: c.all_gather(dy, axis=dy.ndim - 1))
gather_from_sequence = RegionOp("gather_from_sequence", lambda c, x: c.all_gather(x, axis=SEQ), _sum_scatter)
reduce_scatter_to_sequence = RegionOp("reduce_scatter_to_sequence", _sum_scatter,
                                      lambda c, dy: c.all_gather(dy, axis=SEQ))


def input_region(sequence_parallel):
    """Entering a column-parallel layer: f, or the sequence all-gather."""
    return gather_from_sequence if sequence_parallel else copy_to_region


def output_region(sequence_parallel):
    """Leaving a row-parallel layer (or a vocab-parallel embedding): g, or the sequence reduce-scatter."""
    return reduce_scatter_to_sequence if sequence_parallel else reduce_from_region
