"""Exercise 36 (docs/course/11-mixed-precision.md): which ranks' maxima make a sharded weight's amax.

An FP8 recipe scales the forward GEMM's weight W (K inputs x M outputs) of a linear layer either as a
whole tensor ("tensor": one amax) or per output column along K ("row": one amax per column).  Tensor
parallelism cuts W: a column-parallel layer holds M / tp of the columns, a row-parallel one K / tp of
the rows.  With fp8_gather, ZeRO-3 quantises each rank's slice of W before gathering it: the slices
are spread over the dp x cp ranks holding the same layer.

The grid: sizes {"tp", "cp", "dp", "pp"}, rank = tp_i + tp (cp_i + cp (dp_i + dp pp_i)) (tp fastest).
Return the global ranks (any order) whose own maxima must be combined into the amax that ``rank`` uses
for W - every rank holding a piece of what that amax covers, ``rank`` included.

Check: .venv/bin/hpcpar course check 36
"""


def amax_ranks(rank, sizes, layer, scaling, fp8_gather=False):
    raise NotImplementedError
