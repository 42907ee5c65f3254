"""The worked example of ring attention: a sequence of 8 tokens on two ranks (docs/context_parallel.md).

    .venv/bin/mpiexec -n 2 .venv/bin/python -m hpcpar.examples.ring_by_hand

The sequence is cut into 2 cp = 4 chunks of 2 tokens; rank 0 holds chunks 0 and 3 (positions 0, 1,
6, 7), rank 1 chunks 1 and 2 (positions 2, 3, 4, 5).  Each rank computes its queries against its own
keys first, then against the other rank's keys, which arrive while it computes; the trimmed block
sizes show that each rank does the same causal work.  Every rank draws the same full q, k, v and
keeps its tokens, so the ring's output and gradients can be compared with one rank's attention.
"""
import sys

import numpy as np

from hpcpar.examples._common import once, rank_by_rank, require_size

T, CP, HS = 8, 2, 4                  # tokens, ranks, head size (one sequence, one head)


def main():
    from mpi4py import MPI

    from hpcpar.comm import Communicator
    from hpcpar.context_parallel.ring import RingAttention
    from hpcpar.ops.attention import attention_backward, attention_forward
    from hpcpar.ops.ring_attention import balanced_positions, ring_source, visible

    world = MPI.COMM_WORLD
    require_size(world, CP, "ring_by_hand")
    cp = Communicator(world, "cp")              # the context-parallel group: here the whole job
    r = cp.rank
    q, k, v, do = np.random.default_rng(0).standard_normal((4, 1, 1, T, HS))    # each (B, NH, T, HS)
    pos = [balanced_positions(T, CP, j) for j in range(CP)]
    mine = pos[r]

    once(world, f"{T} tokens in {2 * CP} chunks of {T // (2 * CP)}; rank i holds chunks i and {2 * CP - 1}-i")
    lines = [f"holds positions {tuple(int(p) for p in mine)}"]
    work = 0
    for step in range(CP):
        j = ring_source(r, step, CP)
        rows, cols = visible(mine, pos[j])
        n_q, n_k = len(range(T // CP)[rows]), len(range(T // CP)[cols])
        work += n_q * n_k
        lines.append(f"step {step}: keys of rank {j} {tuple(int(p) for p in pos[j])}: "
                     f"{n_q} queries x {n_k} keys")
    lines.append(f"scores computed: {work}, of which causal (key <= query): {int(sum(mine + 1))}")
    rank_by_rank(world, lines)

    ring = RingAttention(cp)
    o, cache = ring.forward(q[..., mine, :], k[..., mine, :], v[..., mine, :], None, False, None)
    grads = [np.empty_like(o) for _ in range(3)]
    ring.backward(np.ascontiguousarray(do[..., mine, :]), cache, grads)
    o_ref, ref_cache = attention_forward(q, k, v)
    ref = attention_backward(do, ref_cache)
    # float64; the ring adds the softmax up in another order than one rank: equal to rounding
    err = max(float(np.abs(a - b[..., mine, :]).max()) for a, b in zip([o] + grads, (o_ref,) + tuple(ref)))
    block = 2 * (T // CP) * HS * 8                      # one [K | V] block, float64
    rank_by_rank(world, [f"sent {cp.stats.bytes['send']} B = {CP - 1} [K|V] forward + {CP - 1} [K|V] and "
                         f"{CP} [dK|dV] backward, {block} B each",
                         f"O, dQ, dK, dV equal one rank's attention: {err < 1e-12}"])
    return 0


if __name__ == "__main__":
    from hpcpar.runtime import run_guarded
    sys.exit(run_guarded(main))
