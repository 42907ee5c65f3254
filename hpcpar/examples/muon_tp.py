"""Muon's three tensor-parallel modes on two ranks: one matrix, cut by columns (docs/optimizers.md).

    .venv/bin/mpiexec -n 2 .venv/bin/python -m hpcpar.examples.muon_tp

U is a (4, 8) update, held (in, out) as hpcpar holds a weight and cut by columns as a column-parallel
layer cuts it: rank r holds U_r = U[:, 4r:4r+4].  Muon wants O = NS(U), Newton-Schulz on the whole
matrix (optim/newton_schulz.py).  Each mode below is tensor_parallel/muon.py's, run on the two ranks:

    duplicated    all-gather U (each rank sends its 16 numbers), NS on the whole (4, 8) on both ranks,
                  keep O_r: the whole matrix's numbers
    distributed   ||U||^2 = ||U_0||^2 + ||U_1||^2 (one all-reduce), then per iteration the (4, 4) Gram
                  A = U_0 U_0^T + U_1 U_1^T (one all-reduce) and X_r <- a X_r + (b A + c A^2) X_r: the
                  whole matrix's numbers, each rank multiplying only its half
    blockwise     NS(U_r) on each rank alone: two orthogonal (4, 4) blocks, side by side - not NS(U)

The last lines show the difference: the singular values of the two halves put back together.
"""
import sys

import numpy as np

from hpcpar.examples._common import once, rank_by_rank, require_size, snapshot, traffic

U = np.round(np.random.default_rng(49).normal(size=(4, 8)), 1)


def main():
    from mpi4py import MPI

    from hpcpar.comm import Communicator
    from hpcpar.nn.parameter import Parameter, Shard
    from hpcpar.optim.muon import NewtonSchulz
    from hpcpar.optim.newton_schulz import newton_schulz
    from hpcpar.tensor_parallel.muon import MODES, TensorParallelMuon

    world = MPI.COMM_WORLD
    require_size(world, 2, "muon_tp")
    tp = Communicator(world, "tp")
    r = tp.rank
    p = Parameter("demo.weight", U.copy()).shard_(Shard(1, 2, r))        # rank r: U[:, 4r:4r+4]
    whole = newton_schulz(U)
    cols = slice(4 * r, 4 * r + 4)
    once(world, f"U (4, 8), rank r holds U[:, 4r:4r+4]; one rank's NS(U) has singular values "
                f"{_sv(whole)}")
    for mode in MODES:
        once(world)
        before = snapshot(tp)
        o = TensorParallelMuon(tp, mode, NewtonSchulz(5))([p], [p.data])[0]
        sent = traffic(tp, before)
        both = np.concatenate(world.allgather(o), axis=1)
        rank_by_rank(world, [f"{mode:<12} O_r row 0 = {_row(o[0])}   (communication: {sent})",
                             f"{mode:<12} max |O_r - NS(U)[:, 4r:4r+4]| = {np.abs(o - whole[:, cols]).max():.1e}"])
        once(world, f"{mode}: [O_0 | O_1] has singular values {_sv(both)}")
    return 0


def _sv(m):
    return "(" + ", ".join(f"{s:.3f}" for s in np.linalg.svd(m, compute_uv=False)) + ")"


def _row(v):
    return "(" + ", ".join(f"{x:.3f}" for x in v) + ")"


if __name__ == "__main__":
    from hpcpar.runtime import run_guarded
    sys.exit(run_guarded(main))
