"""Cross-entropy over a vocabulary split across the TP group, without gathering the logits.

Rank r holds the logits of vocabulary entries [lo, hi): z (N, V/tp).  The loss needs three numbers
per row that span the whole vocabulary, each a reduction of local pieces:

    m     = max over ranks of the local row maxima                 (all-reduce MAX, for stability)
    S     = sum over ranks of sum_j exp(z_j - m)                     } one all-reduce SUM
    z_t   = the target's logit - m, held by one rank, 0 elsewhere   } of the pair (S, z_t)
    loss  = log S - z_t

Backward is local: dz_j = (exp(z_j - m) / S - [j == t]) dloss, each rank for its own columns.
Columns past the real vocabulary (padding that makes V divide by tp) get -inf logits: probability 0.
Traffic: 3 N numbers instead of N V / tp * (tp - 1) for gathering the logits.
"""
from hpcpar.backend import array_module


def vocab_parallel_cross_entropy_forward(logits, targets, comm, lo, vocab_size):
    """logits (N, Vl) for vocabulary [lo, lo + Vl), targets (N,) global ids -> losses (N,), cache"""
    xp = array_module(logits)
    N, Vl = logits.shape
    rows = xp.arange(N)
    valid = max(0, min(Vl, vocab_size - lo))            # columns that are real vocabulary
    if valid < Vl:
        logits[:, valid:] = -xp.inf
    m = comm.all_reduce(logits.max(axis=-1), op="max")   # (N,)
    z = logits - m[:, None]                              # (N, Vl)
    local_t = targets - lo
    mine = (local_t >= 0) & (local_t < valid)           # rows whose target lives on this rank
    local_t = xp.where(mine, local_t, 0)
    target_logit = xp.where(mine, z[rows, local_t], 0.0)
    xp.exp(z, out=z)
    sums = comm.all_reduce(xp.stack([z.sum(axis=-1), target_logit]))    # (2, N)
    z /= sums[0][:, None]                                # local probabilities
    return xp.log(sums[0]) - sums[1], (z, local_t, mine)


def vocab_parallel_cross_entropy_backward(dloss, cache):
    """dloss scalar or (N,) -> dlogits (N, Vl)"""
    p, local_t, mine = cache
    xp = array_module(p)
    dloss = xp.broadcast_to(xp.asarray(dloss, dtype=p.dtype), (p.shape[0],))
    dz = p * dloss[:, None]
    # every row at once, subtracting 0 where the target is not on this rank: no boolean indexing,
    # which on a GPU would need the number of True entries on the host (a hidden copy)
    dz[xp.arange(p.shape[0]), local_t] -= xp.where(mine, dloss, 0.0)
    return dz
