"""QK-norm (Qwen3, OLMo 2 per head, Gemma 3): RMSNorm over each head's HS features of the queries and the
keys, after their projections and before the rotary positions.

    q (B, NH, T, HS), k (B, NKV, T, HS), gains g_q, g_k (HS,), one per feature, shared by all the heads
    rstd_q = 1 / sqrt(mean_i q_i^2 + eps)       per (b, head, t): a row of HS features
    q' = q rstd_q g_q,     k' = k rstd_k g_k

A score q'_s . k'_t then has a bounded size: at most |g_q| |g_k|, whatever the projections grow to,
which keeps the attention logits - and the softmax - tame in long or low-precision training.

Backward, row by row as RMSNorm's (ops/rmsnorm.py), with qhat = q rstd_q and dqhat = dq' g_q:

    dq   = rstd_q (dqhat - qhat mean_i(dqhat_i qhat_i))          (B, NH, T, HS)
    dg_q = sum over b, heads and t of dq' qhat                   (HS,)     (and the same for k)

The gain's gradient sums over the heads.  A tensor-parallel rank holds NH/tp query and NKV/tp K/V
heads, so its dg_q, dg_k are partial sums over the TP group (all-reduced there, as sequence
parallelism's norms are); the normalisation itself needs nothing from another rank.
"""
from hpcpar.ops.rmsnorm import rmsnorm_backward_input, rmsnorm_backward_weight, rmsnorm_forward


def qk_norm_forward(q, k, g_q, g_k, eps=1e-6):
    """q (B, NH, T, HS), k (B, NKV, T, HS), g_q, g_k (HS,) -> q', k' (the shapes of q, k), cache"""
    qn, c_q = rmsnorm_forward(q, g_q, eps)                    # each row of HS normalised on its own
    kn, c_k = rmsnorm_forward(k, g_k, eps)
    return qn, kn, (c_q, c_k)


def qk_norm_backward_input(dqn, dkn, g_q, g_k, cache):
    """dq', dk' -> dq, dk (their shapes)"""
    c_q, c_k = cache
    return rmsnorm_backward_input(dqn, g_q, c_q), rmsnorm_backward_input(dkn, g_k, c_k)


def qk_norm_backward_weight(dqn, dkn, cache):
    """dq', dk' -> dg_q, dg_k (HS,), summed over the batch, the heads and the tokens"""
    c_q, c_k = cache
    return rmsnorm_backward_weight(dqn, c_q), rmsnorm_backward_weight(dkn, c_k)
