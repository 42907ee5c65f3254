"""Causal multi-head scaled dot-product attention (the part between the QKV and output projections).

    S = Q K^T / sqrt(HS) + M        M[i, j] = -inf for j > i (a token sees only its past)
    P = softmax(S)                  (B, NH, T, T), one distribution over keys per query
    O = (P * D) V                   D an optional dropout mask on the attention probabilities

Backward, with Pd = P * D:
    dV = Pd^T dO,   dPd = dO V^T,   dP = dPd * D,   dS = softmax_backward(dP, P) / sqrt(HS)
    dQ = dS K,      dK = dS^T Q

Heads are independent: splitting them across tensor-parallel ranks needs no communication here.
"""
import math

from hpcpar.backend import array_module
from hpcpar.ops.softmax import softmax_backward, softmax_forward

_masks = {}


def causal_mask(T, dtype, xp):
    """(T, T) additive mask: 0 on and below the diagonal, -inf above (cached per shape)."""
    key = (T, str(dtype), xp.__name__)
    if key not in _masks:
        _masks[key] = xp.triu(xp.full((T, T), -xp.inf, dtype=dtype), k=1)
    return _masks[key]


def split_heads(x, n_head):
    """(B, T, NH*HS) -> (B, NH, T, HS)"""
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, NH, T, HS) -> (B, T, NH*HS), contiguous"""
    B, NH, T, HS = x.shape
    return array_module(x).ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(B, T, NH * HS)


def attention_forward(q, k, v, drop=None):
    """q, k, v (B, NH, T, HS) -> o (B, NH, T, HS), cache. ``drop``: dropout mask like P, or None.
    The 1/sqrt(HS) scale is applied to Q (T x HS) rather than to S (T x T): fewer multiplications."""
    xp = array_module(q)
    q = q * (1.0 / math.sqrt(q.shape[-1]))                   # scaled Q, kept for the backward
    s = q @ k.transpose(0, 1, 3, 2)                          # (B, NH, T, T)
    s += causal_mask(q.shape[2], s.dtype, xp)
    p = softmax_forward(s)                                   # (B, NH, T, T)
    pd = p if drop is None else p * drop
    return pd @ v, (q, k, v, p, drop)                        # (B, NH, T, HS)


def attention_backward(do, cache):
    """do (B, NH, T, HS) -> dq, dk, dv (B, NH, T, HS)  (q in the cache is already scaled)"""
    q, k, v, p, drop = cache
    scale = 1.0 / math.sqrt(q.shape[-1])
    pd = p if drop is None else p * drop
    dv = pd.transpose(0, 1, 3, 2) @ do                        # (B, NH, T, HS)
    dp = do @ v.transpose(0, 1, 3, 2)                         # (B, NH, T, T)
    if drop is not None:
        dp *= drop
    ds = softmax_backward(dp, p)                              # dL/dS
    dq = ds @ k
    dq *= scale                                               # S = (scale Q) K^T
    return dq, ds.transpose(0, 1, 3, 2) @ q, dv
