"""Expert parallelism: the experts of every MoE layer spread over ``ep`` ranks, tokens sent to them and
back by all-to-all (the ep ranks are consecutive ranks of the data x context-parallel group, as in
Megatron-core and torchtitan).

Rank r of the ep group runs experts r El ... (r + 1) El - 1, El = E / ep.  Its own tokens' rows
arrive sorted by expert (ops/moe.py ``route_order``), so the rows for each rank are one slice:

    counts (E,)          rows of each expert here;  send[q] = rows for rank q's experts    (P = ep ranks)
    got = all_to_all(counts)         (P, El): rows rank q sends for each of my experts   (exchange 1, small)
    recv = all_to_allv(xs, send)     (R, C), source by source, expert by expert within  (dispatch)
    xe = recv[perm]                  the same rows expert by expert (source by source within): one slice
                                     per local expert, for the grouped GEMM
    ye = experts(xe)                 my El experts (nn/experts.py: the weights this rank holds)
    ys = all_to_allv(ye[perm^-1], got.sum(1) -> send)    back to each token's rank, in its order  (combine)

The backward sends the gradients the same two ways in reverse: dys to the experts, dxs back.
Every rank of the group makes the same collectives in the same order (the same schedule, the same
layers), so nothing can wait for a partner that is elsewhere.

Each rank holds only its El experts: every expert weight (E, ...) is cut along its first dimension
(``Shard(0, ep, r)``, so checkpoints store each expert once and reshard between ep sizes like any cut).
The gradient of expert e on rank r adds every token of its ep group routed to e; the other ep groups
(the ranks of dp x cp with the same r, (dp x cp) / ep of them: the *expert-data-parallel* group,
Megatron-core's name) hold the same experts and saw other tokens, so the expert gradients are summed
over that group, as the dense ones are over dp x cp (``expert_groups``; the Trainer routes each
parameter to its group, hpcpar/data_parallel/replicas.py buckets them apart, ZeRO-3's
hpcpar/data_parallel/fsdp.py gives them units of their own).  Optimizer state, ZeRO slices and the
gradient norm follow the buckets (the units): each expert is held, updated and counted once per
expert-data-parallel group.
"""
import numpy as np

from hpcpar.backend import array_module, to_numpy
from hpcpar.nn.moe import MoE
from hpcpar.nn.parameter import Shard


def expert_groups(grid, ep):
    """Collective over the world: (the ep group, the expert-data-parallel group) of this rank - ep folded
    into dp x cp (comm/grid.py ``fold``): ep consecutive ranks of dp x cp, and the ranks at the same
    place in every such block, which hold the same experts."""
    return grid.fold(grid.dp_cp_comm, ep, ("ep", "edp"))


def parallelize_experts(stage, comm):
    """Give every MoE layer of ``stage`` the expert-parallel dispatch over ``comm`` and keep only this
    rank's E / ep experts of each. Returns ``stage``."""
    if comm.size > 1:
        for block in stage.transformer_blocks():
            if isinstance(block.mlp, MoE):
                block.mlp.parallel = ExpertParallel(comm, block.mlp.n_expert)
                for p in block.mlp.experts.parameters():
                    p.shard_(Shard(0, comm.size, comm.rank))            # (E, ...) -> (E / ep, ...)
                    p.expert = True
    return stage


def _expert_major(got):
    """Rows received source by source, expert by expert -> the index that lists them expert by expert,
    source by source; and the local experts' offsets."""
    P, El = got.shape
    starts = (np.cumsum(got.reshape(-1)) - got.reshape(-1)).reshape(P, El)
    perm = np.concatenate([np.arange(starts[q, j], starts[q, j] + got[q, j]) for j in range(El) for q in range(P)]
                          + [np.zeros(0, np.int64)])
    return perm, [0] + [int(v) for v in np.cumsum(got.sum(axis=0))]


class ExpertParallel:
    def __init__(self, comm, n_expert):
        self.comm, self.n_local = comm, n_expert // comm.size

    def forward(self, experts, xs, offsets, ctx=None):
        """xs (M, C) this rank's rows for every expert -> their outputs (M, C), cache."""
        comm, P, El = self.comm, self.comm.size, self.n_local
        counts = np.diff(np.asarray(offsets, dtype=np.int64))                    # (E,)
        send = counts.reshape(P, El).sum(axis=1)
        got = to_numpy(comm.all_to_all(counts)).reshape(P, El)
        recv = got.sum(axis=1)
        perm, local = _expert_major(got)
        xp = array_module(xs)
        perm_d = xp.asarray(perm)
        xe = comm.all_to_allv(xs, send, recv)[perm_d]
        ye, c_exp = experts.forward(xe, local, ctx)
        ys = comm.all_to_allv(self._source_major(ye, perm_d), recv, send)
        return ys, (c_exp, perm_d, send, recv)

    def backward(self, experts, dys, cache, defer=None):
        c_exp, perm_d, send, recv = cache
        dye = self.comm.all_to_allv(dys, send, recv)[perm_d]
        dxe = experts.backward(dye, c_exp, defer)
        return self.comm.all_to_allv(self._source_major(dxe, perm_d), recv, send)

    @staticmethod
    def _source_major(rows, perm):
        out = array_module(rows).empty_like(rows)
        out[perm] = rows
        return out
