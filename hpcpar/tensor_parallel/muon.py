"""Muon under tensor parallelism: a rank holds a shard of each cut matrix, and Newton-Schulz wants the
whole matrix.  Three modes (``--muon-tp``), Megatron-core's names:

    duplicated    all-gather the shards of the update U, run Newton-Schulz on the whole matrix on every
                  rank of the group, keep this rank's shard of the result.  Exact; every rank does the
                  whole matrix's work; bytes: the matrix, once a step.
    distributed   keep the shards.  The iteration's only sums are the squared norm and the Gram matrix
                  over the axis the matrix is cut along (optim/newton_schulz.py: (X X^T) X = X (X^T X),
                  so either side's Gram serves): all-reduce the partial Grams every iteration, update
                  each shard locally.  Exact; each rank does 1/tp of the big products; bytes: steps x
                  the Gram of the uncut side (small when the cut side is the long one - the MLP's and
                  Q|K|V's columns, the output projections' rows) and the norm.
    blockwise     Newton-Schulz on each shard as if it were a matrix of its own.  No communication, and a
                  different optimizer: orthogonalising blocks is not orthogonalising their concatenation
                  (docs/optimizers.md measures by how much at tp 2, 4, 8).

A 2-rank example, W (4, 8) cut into two (4, 4) column shards W_0 | W_1 (nn.Linear's rows = outputs):

    duplicated    both ranks: U = [U_0 | U_1] (all-gather, 4 x 8 numbers), O = NS(U), keep O_r
    distributed   rank r: X_r = U_r / ||U||  (||U||^2 = sum_r ||U_r||^2, one all-reduce), then each
                  iteration A = sum_r X_r X_r^T  (4 x 4, one all-reduce),  X_r <- a X_r + (b A + c A^2) X_r
    blockwise     rank r: O_r = NS(U_r)   - a (4, 4) matrix, orthogonal on its own

Replicated parameters (the experts, whole on every TP rank) and one rank go straight to the whole
iteration.  ``hpcpar.examples.muon_tp`` runs the example; tests/test_muon_mpi.py holds duplicated and
distributed to one rank's Muon.
"""
from hpcpar.flops import newton_schulz_flops
from hpcpar.optim.muon import matrices, orthogonalise_whole
from hpcpar.optim.newton_schulz import newton_schulz_cut

MODES = ("duplicated", "distributed", "blockwise")


class TensorParallelMuon:
    """``orthogonalise(p, U)`` for Muon (optim/muon.py) over the TP group ``comm`` in mode ``mode``."""

    def __init__(self, comm, mode, ns):
        self.comm, self.mode, self.ns = comm, mode, ns

    def __call__(self, p, u):
        cut = p.shard is not None and not p.expert and self.comm.size > 1    # an expert: whole over TP
        if not cut or self.mode == "blockwise":
            return orthogonalise_whole(p, u, self.ns)
        if self.mode == "duplicated":
            return self.duplicated(p, u)
        return self.distributed(p, u)

    def duplicated(self, p, u):
        shards = self.comm.all_gather(u[None])                          # (tp, *u.shape)
        whole = p.shard.assemble(list(shards), p.full_shape)           # the whole update
        return p.shard.take(orthogonalise_whole(p, whole, self.ns))

    def distributed(self, p, u):
        ns, axis = self.ns, p.shard.dim                                # the Gram sums over the cut axis
        pieces = matrices(p, u)
        done = newton_schulz_cut(pieces, [axis] * len(pieces), self.comm.all_reduce, ns.steps, ns.coefficients,
                                 dtype=ns.dtype)
        out = u.copy()
        for o, d in zip(matrices(p, out), done):
            o[...] = d
            ns.flops += newton_schulz_flops(d.shape[1 - axis], d.shape[axis], ns.steps)
        return out


def muon_options(cfg, tp_comm, xp):
    """make_optimizer's Muon settings for a run's options (training/train.py): the iteration, the scale,
    and the TP mode over ``tp_comm``; nothing for another optimizer."""
    if cfg.optimizer != "muon":
        return {}
    from hpcpar.optim.muon import NewtonSchulz
    from hpcpar.precision import bfloat16
    ns = NewtonSchulz(cfg.ns_steps, bfloat16(xp) if cfg.ns_bf16 else None)
    return dict(ns=ns, scale_kind=cfg.muon_scale, nesterov=cfg.nesterov,
                orthogonalise=TensorParallelMuon(tp_comm, cfg.muon_tp, ns))
