"""The router of a mixture of experts: scores, top-k choice, combine weights; the load-balancing loss.

Shapes: N tokens, E experts, k experts per token.

    l = x W_router                          x (N, C) -> logits l (N, E)
    s = softmax(l)      (Mixtral, Qwen-MoE)     or     s = sigmoid(l)      (DeepSeek-V3)
    idx = top-k of (s + b) per row          (N, k)   b (E,): DeepSeek-V3's balancing bias, choice only
    g = s[idx]                              (N, k)   the chosen experts' scores
    w = g / sum_j g_j   (normalised)    or   w = g                         combine weights (N, k)

The bias ``b`` moves the choice and never the weights, so it has no gradient: it is updated by a rule
instead (``balance_bias_update``), DeepSeek-V3's auxiliary-loss-free load balancing.

DeepSeek-V3's two further steps (its config: n_group, topk_group, routed_scaling_factor):

    group-limited choice    the E experts are G groups of E/G; a group's score is the sum of its two
                            best s + b; only the experts of the topk_group best groups may be chosen
                            (the others' s + b set to -inf before the top-k: a token's experts then sit
                            on at most topk_group groups - nodes, in V3's deployment - bounding its traffic)
    routed scaling          w <- rho w after the renormalisation (rho = 2.5 in V3), so the routed experts'
                            sum keeps its size beside the shared expert's

Both are piecewise constant or linear in w: the choice has no gradient, and dw picks up rho.

Backward (idx is piecewise constant: no gradient flows through the choice):

    dg = (dw - sum_j dw_j w_j) / sum_j g_j      (normalised; else dg = dw)
    ds = dg scattered to the chosen columns, plus the auxiliary loss's ds
    dl = s (ds - sum_e ds_e s_e)                (softmax)      dl = ds s (1 - s)     (sigmoid)

The load-balancing loss (Switch Transformer; Mixtral's form in transformers), per layer:

    aux = E sum_e f_e P_e,      f_e = (tokens routed to e) / N,     P_e = (1/N) sum_t p_te
    p = s (softmax)  or  s / sum_e s_e  (sigmoid: scores made a distribution, as DeepSeek-V3 does)

f_e counts choices (k per token), so a perfectly even load gives aux = k.  f is piecewise constant;
the gradient flows through P only:  d aux / d p_te = E f_e / N.
"""
from hpcpar.backend import array_module

SCORES = ("softmax", "sigmoid")


def _scores(logits, score):
    xp = array_module(logits)
    if score == "softmax":
        e = xp.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    return 0.5 * (1.0 + xp.tanh(0.5 * logits))             # sigmoid, no exp(-l) to overflow


def _normalise_backward(dw, w, total):
    """w = g / total, total = sum_j g_j  ->  dg = (dw - sum_j dw_j w_j) / total  (rows)"""
    return (dw - (dw * w).sum(axis=1, keepdims=True)) / total


def group_limited(choice, n_group, topk_group):
    """choice (N, E) -> the same with -inf outside each row's ``topk_group`` best of ``n_group`` groups
    (a group's score: the sum of its two largest entries)."""
    xp = array_module(choice)
    N, E = choice.shape
    grouped = choice.reshape(N, n_group, E // n_group)
    top2 = -xp.partition(-grouped, 1, axis=2)[:, :, :2]                 # (N, G, 2): each group's two best
    group_score = top2.sum(axis=2)                                      # (N, G)
    kept = xp.argpartition(-group_score, topk_group - 1, axis=1)[:, :topk_group]
    allowed = xp.zeros((N, n_group), dtype=bool)
    allowed[xp.arange(N)[:, None], kept] = True
    return xp.where(xp.repeat(allowed, E // n_group, axis=1), choice, -xp.inf)


def router_forward(logits, k, score="softmax", bias=None, normalise=True, groups=(1, 1), scale=1.0):
    """logits (N, E) -> idx (N, k) ints, w (N, k) combine weights, cache.  ``groups``: (n_group,
    topk_group) of the group-limited choice; ``scale``: the routed scaling factor.
    The k chosen experts of a row are in decreasing order of s + b (as torch.topk gives them)."""
    xp = array_module(logits)
    s = _scores(logits, score)                              # (N, E)
    choice = s if bias is None else s + bias
    if groups[0] > 1:
        choice = group_limited(choice, *groups)
    idx = xp.argpartition(-choice, k - 1, axis=1)[:, :k]    # the k largest, in no order
    order = xp.argsort(-xp.take_along_axis(choice, idx, axis=1), axis=1, kind="stable")
    idx = xp.take_along_axis(idx, order, axis=1)            # (N, k), best first
    g = xp.take_along_axis(s, idx, axis=1)                  # (N, k)
    total = g.sum(axis=1, keepdims=True) if normalise else None
    w = g / total if normalise else g
    return idx, (w * scale if scale != 1 else w), (score, s, idx, w, total, scale)


def router_backward(dw, cache, ds_extra=None):
    """dw (N, k) [+ ds_extra (N, E), a gradient on the scores s] -> dlogits (N, E)"""
    score, s, idx, w, total, scale = cache
    xp = array_module(s)
    dw = dw * scale if scale != 1 else dw                   # w_out = rho w
    dg = dw if total is None else _normalise_backward(dw, w, total)     # (N, k)
    ds = xp.zeros_like(s) if ds_extra is None else ds_extra.copy()
    ds[xp.arange(len(s))[:, None], idx] += dg               # the k columns of a row are distinct
    if score == "softmax":
        return s * (ds - (ds * s).sum(axis=1, keepdims=True))
    return ds * s * (1.0 - s)


def expert_counts(idx, n_expert):
    """How many of the N k choices went to each expert: (E,) ints."""
    xp = array_module(idx)
    return xp.bincount(idx.reshape(-1), minlength=n_expert)


def load_balance_forward(cache, counts):
    """aux = E sum_e f_e P_e of the router's cache and the choices' counts (E,); returns (aux, f)."""
    score, s = cache[0], cache[1]
    N, E = s.shape
    p = s if score == "softmax" else s / s.sum(axis=1, keepdims=True)
    f = counts / N                                          # (E,)
    return float(E * (f * p.mean(axis=0)).sum()), f


def load_balance_backward(daux, cache, f):
    """d(daux * aux)/ds (N, E): daux E f_e / N on every p_te, through p's normalisation for sigmoid."""
    score, s = cache[0], cache[1]
    xp = array_module(s)
    N, E = s.shape
    dp = xp.broadcast_to(daux * E * f / N, s.shape)
    if score == "softmax":
        return xp.array(dp)
    total = s.sum(axis=1, keepdims=True)
    return _normalise_backward(dp, s / total, total)


def balance_bias_update(bias, counts, rate):
    """DeepSeek-V3's auxiliary-loss-free balancing, once a step: b_e += rate sign(mean load - load_e).
    An overloaded expert's bias goes down, so the choice (never the weights) moves to others."""
    xp = array_module(bias)
    load = counts.astype(bias.dtype)
    bias += rate * xp.sign(load.mean() - load)
    return bias
