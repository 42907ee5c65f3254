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
from hpcpar.backend import array_module
from hpcpar.flops import newton_schulz_flops
from hpcpar.optim.matrices import block_matrices
from hpcpar.optim.muon import matrices, orthogonalise_whole
from hpcpar.optim.newton_schulz import newton_schulz_cut

MODES = ("duplicated", "distributed", "blockwise")


class TensorParallelMuon:
    """``orthogonalise(ps, Us)`` for Muon (optim/muon.py) over the TP group ``comm`` in mode ``mode``: one
    all-gather (duplicated) or steps + 1 all-reduces (distributed) for all the cut matrices of a slice."""

    def __init__(self, comm, mode, ns):
        self.comm, self.mode, self.ns = comm, mode, ns

    def __call__(self, ps, us):
        cut = [i for i, p in enumerate(ps) if p.shard is not None and not p.expert and self.comm.size > 1
               and self.mode != "blockwise"]                        # an expert: whole over TP
        out = [None if i in cut else orthogonalise_whole(p, u, self.ns) for i, (p, u) in enumerate(zip(ps, us))]
        if cut:
            done = (self.duplicated if self.mode == "duplicated" else self.distributed)([ps[i] for i in cut],
                                                                                         [us[i] for i in cut])
            for i, o in zip(cut, done):
                out[i] = o
        return out

    def duplicated(self, ps, us):
        """Every rank's shards in one all-gather; Newton-Schulz on each whole matrix; this rank's shard."""
        xp = array_module(us[0])
        shards = self.comm.all_gather(xp.concatenate([u.reshape(-1) for u in us])[None])    # (tp, numbers)
        out, at = [], 0
        for p, u in zip(ps, us):
            whole = p.shard.assemble([s[at:at + u.size].reshape(u.shape) for s in shards], p.full_shape)
            out.append(p.shard.take(orthogonalise_whole(p, whole, self.ns)))
            at += u.size
        return out

    def distributed(self, ps, us):
        """Each rank its shards; the norms' and Grams' sums over the group, one all-reduce an iteration."""
        ns = self.ns
        pieces = [(m, p.shard.dim) for p, u in zip(ps, us) for m in matrices(p, u)]  # the Gram sums over the cut
        done = iter(newton_schulz_cut([m for m, _ in pieces], [axis for _, axis in pieces], self.comm.all_reduce,
                                      ns.steps, ns.coefficients, dtype=ns.dtype))
        out = []
        for p, u in zip(ps, us):
            o = array_module(u).empty_like(u)
            axis = p.shard.dim
            for view in matrices(p, o):
                view[...] = next(done)
                ns.flops += newton_schulz_flops(view.shape[1 - axis], view.shape[axis], ns.steps)
            out.append(o)
        return out


def muon_costs(shape, blocks, tp, ep, mode, steps, itemsize, gram_itemsize=None, owners=(1, 1)):
    """(Newton-Schulz FLOPs, bytes this rank hands the TP group) of one Muon step on a rank holding
    ``blocks`` blocks of ``shape`` (optim/matrices.py ``block_matrices``) in ``mode``: what the engine
    counts (NewtonSchulz.flops, the tp communicator's bytes) and what the planner charges (tools/plan/step.py).
    ``itemsize``: of an update (the master dtype); ``gram_itemsize``: of a Gram's sum (the iteration's
    accumulator; default the same).  ``owners``: under ZeRO each matrix is orthogonalised by its owner
    alone, so the ranks of a group share the work - (the dense matrices' group, the experts'): the
    result is then a rank's mean share (the owners' balance: tools/bench/muon.py)."""
    flops = sent = 0
    for rows, cols, n, cut, routed in block_matrices(shape):
        n = n * blocks / (ep if routed else 1) / owners[routed]
        if cut is None or tp == 1 or mode == "duplicated":
            flops += n * newton_schulz_flops(min(rows, cols), max(rows, cols), steps)
            sent += n * rows * cols / tp * itemsize if cut is not None and tp > 1 else 0     # the all-gather
        elif mode == "blockwise":
            local = (rows / tp, cols) if cut == 0 else (rows, cols / tp)
            flops += n * newton_schulz_flops(min(local), max(local), steps)
        else:                                       # distributed: the Gram of the uncut side, each iteration
            kept, summed = (cols, rows / tp) if cut == 0 else (rows, cols / tp)
            flops += n * newton_schulz_flops(kept, summed, steps)
            sent += n * (1 + steps * kept * kept) * (gram_itemsize or itemsize)
    return flops, sent


def muon_options(cfg, tp_comm, xp):
    """make_optimizer's Muon settings for a run's options (training/step.py): the iteration, the scale,
    and the TP mode over ``tp_comm``; nothing for another optimizer."""
    if cfg.optimizer != "muon":
        return {}
    from hpcpar.optim.muon import NewtonSchulz
    from hpcpar.precision import bfloat16
    ns = NewtonSchulz(cfg.ns_steps, bfloat16(xp) if cfg.ns_bf16 else None)
    return dict(ns=ns, scale_kind=cfg.muon_scale, nesterov=cfg.nesterov,
                orthogonalise=TensorParallelMuon(tp_comm, cfg.muon_tp, ns))
