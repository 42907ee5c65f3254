"""Cross-entropy of next-token predictions, from logits, numerically stable.

    loss_i = logsumexp(z_i) - z_i[t_i] = log sum_j exp(z_ij - m_i) + m_i - z_i[t_i],   m_i = max_j z_ij
    dz_i   = (softmax(z_i) - onehot(t_i)) * dloss_i

The forward returns per-row losses; the caller decides how they are averaged (the training step sums
them and scales by 1 / (tokens in the global batch), so that micro-batches and data-parallel ranks add
up to exactly the single-rank mean).  The cache holds the probabilities, computed in place of a copy of
the logits.
"""
from hpcpar.backend import array_module


def cross_entropy_forward(logits, targets):
    """logits (N, V), targets (N,) ints -> losses (N,), cache"""
    xp = array_module(logits)
    rows = xp.arange(logits.shape[0])
    m = logits.max(axis=-1, keepdims=True)                    # (N, 1)
    p = logits - m                                            # (N, V) shifted logits
    target_logit = p[rows, targets]                           # (N,)
    xp.exp(p, out=p)
    total = p.sum(axis=-1)                                    # (N,)
    losses = xp.log(total) - target_logit
    p /= total[:, None]                                       # (N, V) probabilities
    return losses, (p, targets)


def cross_entropy_backward(dloss, cache):
    """dloss: scalar or (N,) weight of each row's loss -> dlogits (N, V)"""
    p, targets = cache
    xp = array_module(p)
    dloss = xp.asarray(dloss, dtype=p.dtype)
    dz = p * (dloss[:, None] if dloss.ndim else dloss)
    dz[xp.arange(p.shape[0]), targets] -= dloss
    return dz
