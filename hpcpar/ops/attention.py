"""Causal multi-head scaled dot-product attention (the part between the QKV and output projections).

    S = Q K^T / sqrt(HS) + M        M[i, j] = -inf for j > i (a token sees only its past)
    P = softmax(S)                  (B, NH, T, T), one distribution over keys per query
    O = (P * D) V                   D an optional dropout mask on the attention probabilities

Backward, with Pd = P * D:
    dV = Pd^T dO,   dPd = dO V^T,   dP = dPd * D,   dS = softmax_backward(dP, P) / sqrt(HS)
    dQ = dS K,      dK = dS^T Q

Heads are independent: splitting them across tensor-parallel ranks needs no communication here.
In a low precision the four GEMMs take and give low-precision arrays; S is masked and softmaxed in
fp32, P rounded to the low precision for P V (as fused attention kernels do), and dS computed in fp32.
"""
import math

from hpcpar.backend import array_module
from hpcpar.precision import gemm, to_fp32
from hpcpar.ops.softmax import softmax_backward, softmax_forward, softmax_forward_fast

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
    """(B, NH, T, HS) -> (B, T, NH*HS), contiguous (no copy if x is a view of a (B, T, NH, HS) array)"""
    B, NH, T, HS = x.shape
    return array_module(x).ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(B, T, NH * HS)


def attention_forward(q, k, v, drop=None):
    """q, k, v (B, NH, T, HS) -> o (B, NH, T, HS), cache. ``drop``: dropout mask like P, or None.

    The 1/sqrt(HS) scale is applied to Q (T x HS) rather than to S (T x T): fewer multiplications.
    The softmax overwrites S (not needed again).  o is written as a (B, NH, T, HS) view of a
    (B, T, NH, HS) array, so that merge_heads afterwards is a reshape rather than a copy."""
    xp = array_module(q)
    B, NH, T, HS = q.shape
    q = q * (1.0 / math.sqrt(HS))                            # scaled Q, kept for the backward
    s = to_fp32(gemm(q, k.transpose(0, 1, 3, 2)))           # (B, NH, T, T)
    s += causal_mask(T, s.dtype, xp)
    p = softmax_forward_fast(s, out=s)                       # (B, NH, T, T)
    pd = (p if drop is None else p * drop).astype(v.dtype, copy=False)
    o = xp.empty((B, T, NH, HS), dtype=q.dtype).transpose(0, 2, 1, 3)
    gemm(pd, v, out=o)                                       # (B, NH, T, HS)
    return o, (q, k, v, p, drop)


def attention_backward(do, cache, out=None):
    """do (B, NH, T, HS) -> dq, dk, dv (B, NH, T, HS)  (q in the cache is already scaled).

    ``out``: three (B, NH, T, HS) arrays, possibly strided views, to write dq, dk, dv into (the
    attention module passes views of one fused [dQ | dK | dV] array, saving three copies)."""
    q, k, v, p, drop = cache
    xp = array_module(do)
    dq, dk, dv = out if out is not None else (xp.empty(q.shape, dtype=q.dtype) for _ in range(3))
    pd = (p if drop is None else p * drop).astype(v.dtype, copy=False)
    gemm(pd.transpose(0, 1, 3, 2), do, out=dv)                # dV = Pd^T dO
    dp = to_fp32(gemm(do, v.transpose(0, 1, 3, 2)))           # (B, NH, T, T)
    if drop is not None:
        dp *= drop
    ds = softmax_backward(dp, p).astype(q.dtype, copy=False)  # dL/dS, in place of dP
    gemm(ds, k, out=dq)
    dq *= 1.0 / math.sqrt(q.shape[-1])                        # S = (scale Q) K^T
    gemm(ds.transpose(0, 1, 3, 2), q, out=dk)
    return dq, dk, dv


def attention_cached_forward(q, k, v, k_cache, v_cache, start):
    """Forward only, for generation: the new tokens at positions [start, start + T) attend to every
    cached token before them, and are themselves added to the KV cache.

    q (B, NH, T, HS), k, v (B, NKV, T, HS) of the new tokens; k_cache, v_cache (B, NKV, T_max, HS) hold
    the keys and values of positions [0, start) and receive k, v at [start, start + T).  Query i
    (position start + i) sees keys 0 .. start + i:  S = Q K_cache^T / sqrt(HS) + M, M[i, j] = -inf for
    j > start + i.  With start = 0 this is attention_forward; one new token at a time costs O(T_max)
    instead of O(T_max^2), which is what makes sampling a long text affordable.

    Grouped-query attention (ops/gqa.py) has NKV < NH: query head h reads K/V head h // (NH/NKV).  The
    query heads are viewed as NKV groups of NH/NKV, (B, NKV, NH/NKV, T, HS), and each cached K/V head is
    broadcast over its group - read, never copied.  NKV = NH is plain multi-head attention (GPT-2).
    -> o (B, NH, T, HS)"""
    xp = array_module(q)
    B, NH, T, HS = q.shape
    NKV, end = k.shape[1], start + T
    k_cache[:, :, start:end] = k
    v_cache[:, :, start:end] = v
    q = (q * (1.0 / math.sqrt(HS))).reshape(B, NKV, NH // NKV, T, HS)       # (B, NKV, group, T, HS)
    s = q @ k_cache[:, :, None, :end].swapaxes(-1, -2)                        # (B, NKV, group, T, end)
    s += xp.triu(xp.full((T, end), -xp.inf, dtype=s.dtype), k=start + 1)
    o = softmax_forward(s, out=s) @ v_cache[:, :, None, :end]                 # (B, NKV, group, T, HS)
    return o.reshape(B, NH, T, HS)
