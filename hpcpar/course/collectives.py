"""The collectives in numbers: what each moves, its alpha-beta cost, and the ring all-reduce step by step.

Cost model (Hockney): a message of n bytes between two ranks takes  alpha + n beta  (alpha: latency,
beta: seconds per byte = 1 / bandwidth).  For p ranks, with the algorithms MPI libraries use for
large messages (ring for the gather/scatter family, a binomial tree for one-root operations), where n
is the size of one rank's full buffer:

    send/recv        alpha + n beta
    broadcast        ceil(log2 p) (alpha + n beta)          the tree doubles the ranks that hold it
    reduce           ceil(log2 p) (alpha + n beta)          (the additions are left out)
    all-gather       (p - 1) alpha + (p - 1)/p n beta       n: the gathered result; each rank sends its n/p
    reduce-scatter   (p - 1) alpha + (p - 1)/p n beta       n: each rank's input; it keeps n/p of the sum
    all-reduce       2 (p - 1) alpha + 2 (p - 1)/p n beta   = reduce-scatter + all-gather (ring)

The ring all-reduce's bandwidth term does not grow with p: each rank sends 2 (p-1)/p n bytes, less
than 2n, however many ranks share the sum.  That is why data parallelism scales.
"""
from math import ceil, log2

import numpy as np

COLLECTIVES = ("send/recv", "broadcast", "reduce", "all-gather", "reduce-scatter", "all-reduce")


def cost(name, nbytes, p, alpha, beta):
    """Seconds that collective ``name`` takes on ``p`` ranks for ``nbytes`` (see the module docstring)."""
    if p < 2:
        return 0.0
    tree = ceil(log2(p))
    ring = (p - 1) / p
    formulas = {
        "send/recv": alpha + nbytes * beta,
        "broadcast": tree * (alpha + nbytes * beta),
        "reduce": tree * (alpha + nbytes * beta),
        "all-gather": (p - 1) * alpha + ring * nbytes * beta,
        "reduce-scatter": (p - 1) * alpha + ring * nbytes * beta,
        "all-reduce": 2 * (p - 1) * alpha + 2 * ring * nbytes * beta,
    }
    return formulas[name]


def bytes_sent_per_rank(name, nbytes, p):
    """Bytes each rank puts on the wire (the busiest rank, for the tree ones)."""
    ring = (p - 1) / p
    return {"send/recv": nbytes, "broadcast": ceil(log2(p)) * nbytes, "reduce": ceil(log2(p)) * nbytes,
            "all-gather": ring * nbytes, "reduce-scatter": ring * nbytes,
            "all-reduce": 2 * ring * nbytes}[name]


def ring_allreduce(xs, send):
    """All-reduce of the 1-D arrays ``xs`` (one per simulated rank, equal lengths divisible by p) along
    a ring, calling ``send(src, dst, chunk)`` for every message; returns the arrays every rank holds.

    Each array is cut into p chunks.  Reduce-scatter, p - 1 steps: at step s rank r sends chunk
    (r - s) mod p to rank r + 1, which adds it to its own copy; afterwards rank r holds the full sum
    of chunk (r + 1) mod p.  All-gather, p - 1 more steps: the finished chunks travel the same ring,
    each overwriting the receiver's copy.
    """
    p = len(xs)
    chunks = [list(x.copy().reshape(p, -1)) for x in xs]         # chunks[rank][c]: (n/p,)
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(p - 1):
            # reduce-scatter: rank r sends chunk r - s; all-gather: the chunk it completed, (r + 1) - s
            shift = s if phase == "reduce-scatter" else s - 1
            outgoing = [(r, (r - shift) % p, chunks[r][(r - shift) % p].copy()) for r in range(p)]
            for r, c, data in outgoing:                       # every rank sends, then every rank receives
                dst = (r + 1) % p
                send(r, dst, data)
                if phase == "reduce-scatter":
                    chunks[dst][c] = chunks[dst][c] + data
                else:
                    chunks[dst][c] = data
    return [np.concatenate(rank_chunks) for rank_chunks in chunks]
