"""The worked example of the column split: one matrix multiply shared by two ranks (docs/tensor_parallel.md).

    .venv/bin/mpiexec -n 2 .venv/bin/python -m hpcpar.examples.tp_split

    W = [[1, 2, 3, 4],          x = (1, 1)          x W = (6, 8, 10, 12)
         [5, 6, 7, 8]]

Column split (ColumnParallelLinear): rank 0 holds columns 0-1 of W, rank 1 columns 2-3.  Each computes
its own outputs, (6, 8) and (10, 12), from the whole input, with no communication; an all-gather puts
them side by side.  In backward each rank can only form its own part of dL/dx, so the parts are summed
(the f operator's all-reduce).

Row split (RowParallelLinear): rank 0 holds row 0 of W and x_0, rank 1 row 1 and x_1.  Each computes a
full-width *partial sum*, and only their sum - an all-reduce (the g operator) - is x W.

Both layers are built the way the engine builds them: every rank makes the full serial layer and the
parallel layer keeps its slice.  The counters of hpcpar.comm show what crossed between the ranks.
"""
import sys

import numpy as np

from hpcpar.examples._common import once, rank_by_rank, require_size, snapshot, traffic, vec

W = np.array([[1.0, 2.0, 3.0, 4.0],
              [5.0, 6.0, 7.0, 8.0]])
X = np.array([[1.0, 1.0]])                   # one row: a batch of one token with 2 features


def full_layer(name):
    """The serial layer every rank builds first: y = x W + b, W (2, 4), b = 0."""
    from hpcpar.nn.linear import Linear
    lin = Linear(name, 2, 4, 0.02, 0, np.float64)
    lin.weight.data[...] = W
    return lin


def main():
    from mpi4py import MPI

    from hpcpar.comm import Communicator
    from hpcpar.ops.linear import linear_backward_input, linear_forward
    from hpcpar.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from hpcpar.tensor_parallel.regions import gather_from_region

    world = MPI.COMM_WORLD
    require_size(world, 2, "tp_split")
    tp = Communicator(world, "tp")             # the tensor-parallel group: here the whole job
    r = tp.rank

    once(world, "x W on one rank: " + vec(X @ W))
    once(world)
    once(world, "column split: rank i holds W[:, 2i:2i+2] and the whole x")
    col = ColumnParallelLinear(full_layer("col"), tp)
    s = snapshot(tp)
    y_local, cache = col.forward(X)
    fwd = traffic(tp, s)
    s = snapshot(tp)
    y_full = gather_from_region.forward(tp, y_local)          # all-gather along the last axis
    gather = traffic(tp, s)
    rank_by_rank(world, [f"holds W[:, {2 * r}:{2 * r + 2}] = {vec(col.weight.data)}",
                         f"computes x W_{r} = {vec(y_local)}   (communication: {fwd})",
                         f"gathered {vec(y_full)}   (communication: {gather})"])
    once(world, "gathered == x W: " + str(bool(np.array_equal(y_full, X @ W))))

    once(world)
    once(world, "column split, backward with dL/dy = (1, 1, 1, 1): dL/dx = dL/dy W^T = "
                + vec(np.ones((1, 4)) @ W.T))
    dy_local = np.ones((1, 2))                                # this rank's columns of dL/dy
    partial = linear_backward_input(dy_local, col.weight.data)
    s = snapshot(tp)
    dx = col.backward(dy_local, cache)                        # f: all-reduce of the parts
    bwd = traffic(tp, s)
    rank_by_rank(world, [f"its part dL/dy_{r} W_{r}^T = {vec(partial)}",
                         f"after the all-reduce dL/dx = {vec(dx)}   (communication: {bwd})"])

    once(world)
    once(world, "row split: rank i holds row W[i, :] and x_i")
    row = RowParallelLinear(full_layer("row"), tp)
    x_local = X[:, r:r + 1]                                   # (1, 1): this rank's feature
    partial = linear_forward(x_local, row.weight.data)        # what this rank can compute alone
    s = snapshot(tp)
    y, _ = row.forward(x_local)                               # partial sum, then g: all-reduce
    fwd = traffic(tp, s)
    rank_by_rank(world, [f"holds W[{r}, :] = {vec(row.weight.data)}, x_{r} = {vec(x_local)}",
                         f"partial sum x_{r} W[{r}, :] = {vec(partial)}",
                         f"after the all-reduce {vec(y)}   (communication: {fwd})"])
    once(world, "all-reduced == x W: " + str(bool(np.array_equal(y, X @ W))))
    return 0


if __name__ == "__main__":
    from hpcpar.runtime import run_guarded
    sys.exit(run_guarded(main))
