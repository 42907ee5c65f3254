"""Causal multi-head scaled dot-product attention (the part between the QKV and output projections).

    S = Q K^T / sqrt(HS) + M        M[i, j] = -inf for j > i (a token sees only its past)
    P = softmax(S)                  (B, NH, T, T), one distribution over keys per query
    O = (P * D) V                   D an optional dropout mask on the attention probabilities

Backward, with Pd = P * D:
    dV = Pd^T dO,   dPd = dO V^T,   dP = dPd * D,   dS = softmax_backward(dP, P) / sqrt(HS)
    dQ = dS K,      dK = dS^T Q

Causal blocks.  Above the diagonal P is exactly zero, so the products there are wasted work: half of
every T x T GEMM, softmax and mask.  The queries are cut into blocks of rows [a, z) (``query_blocks``);
a block's queries see keys [0, z) only, so its S, P and dS are (B, NH, z - a, z) and only the block's
own diagonal square needs the mask.  The four T x T GEMMs and the softmax then do (n + 1) / (2 n) of
the work for n blocks (0.75 at T = 128 in blocks of 64).  dV and dK sum over query blocks: the last
block (every key) writes them, the earlier ones add into their first z rows.  Each block's numbers
are the plain ones, summed in a different order: equal to rounding (tests/test_fast_ops.py, float64
to 1e-12); ``block=T`` is the full-matrix attention, one block.  ``attention_forward_plain`` and
``attention_backward_plain`` are the lines above on whole (B, NH, T, T) matrices, masks included:
read them first (tests/test_fast_ops.py holds the engine's pair to them, float64 to 1e-12).

Documents and sliding windows (``attn_mask``, ops/masks.py's rule).  A query block's keys are one run
[lo, z), lo the start of its first query's document (or its window's edge): the block skips the keys
before lo - whole key blocks of other documents - and masks its (z - a, z - lo) rectangle by the rule
instead of the diagonal square.  ``blocks_work`` counts the score entries computed against the plain
causal blocks' (the profile's "work saved").  Blocks of 64 rows: smaller ones
lose more to small GEMMs than they save (measured in docs/performance.md).  On a GPU one block: there
a launch per op is what costs, not the flops of the upper triangle.

Heads are independent: splitting them across tensor-parallel ranks needs no communication here.
In a low precision the four GEMMs take low-precision arrays; S = Q K^T and dP = dO V^T stay in fp32
(their unrounded sums), S is masked and softmaxed in fp32, P rounded to the low precision for P V (as
fused attention kernels do), and dS computed in fp32; dK and dV are summed over the blocks in fp32 and
rounded once.
"""
import math

import numpy as np

from hpcpar.backend import array_module, is_device_array
from hpcpar.precision import accumulator, gemm
from hpcpar.ops.masks import Mask
from hpcpar.ops.softmax import softmax_backward, softmax_forward, softmax_forward_fast

QUERY_BLOCK = 64
_masks = {}


def causal_mask(T, dtype, xp):
    """(T, T) additive mask: 0 on and below the diagonal, -inf above (cached per shape)."""
    key = (T, str(dtype), xp.__name__)
    if key not in _masks:
        _masks[key] = xp.triu(xp.full((T, T), -xp.inf, dtype=dtype), k=1)
    return _masks[key]


def query_blocks(T, block=QUERY_BLOCK):
    """[(a, z), ...]: query rows [a, z), which see keys [0, z); the last block may be shorter."""
    return [(a, min(a + block, T)) for a in range(0, T, block)]


def causal_work(T, block=QUERY_BLOCK):
    """The share of the T x T score matrix that the blocks compute and keep (1.0 for one block)."""
    return sum((z - a) * z for a, z in query_blocks(T, block)) / (T * T)


def key_blocks(T, block=QUERY_BLOCK, attn_mask=None):
    """[(a, z, lo), ...]: query rows [a, z) and the keys [lo, z) they see (lo = 0 for plain causal)."""
    return [(a, z, 0 if attn_mask is None else attn_mask.first_key(a)) for a, z in query_blocks(T, block)]


def blocks_work(T, block=QUERY_BLOCK, attn_mask=None):
    """(score entries the blocks compute, those the plain causal blocks compute) per sequence and head."""
    blocks = key_blocks(T, block, attn_mask)
    return sum((z - a) * (z - lo) for a, z, lo in blocks), sum((z - a) * z for a, z, _ in blocks)


def engine_block(x):
    """The query block the engine uses for arrays like x: QUERY_BLOCK on the host, all rows on a GPU."""
    return x.shape[-2] if is_device_array(x) else QUERY_BLOCK


def split_heads(x, n_head):
    """(B, T, NH*HS) -> (B, NH, T, HS)"""
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, NH, T, HS) -> (B, T, NH*HS), contiguous (no copy if x is a view of a (B, T, NH, HS) array)"""
    B, NH, T, HS = x.shape
    return array_module(x).ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(B, T, NH * HS)


def _dropped(p, drop, a, z, lo, dtype):
    """Pd of one block: its probabilities times its part of the dropout mask, in the GEMM's dtype."""
    return (p if drop is None else p * drop[:, :, a:z, lo:z]).astype(dtype, copy=False)


def _whole(block, T):
    """Does the block (a, z, lo) see every key?  Then its dK, dV shares are written, not added."""
    a, z, lo = block
    return z == T and lo == 0


def attention_forward_plain(q, k, v, drop=None, attn_mask=None):
    """q, k, v (B, NH, T, HS) -> o (B, NH, T, HS), cache: the textbook lines, in the inputs' dtype."""
    T, HS = q.shape[-2:]
    s = q @ k.swapaxes(-1, -2) / math.sqrt(HS)                                    # (B, NH, T, T)
    s += (attn_mask or Mask()).additive(range(T), range(T), s.dtype, array_module(q))
    p = softmax_forward(s)
    return (p if drop is None else p * drop) @ v, (q, k, v, p, drop)


def attention_backward_plain(do, cache):
    """do (B, NH, T, HS) -> dq, dk, dv (B, NH, T, HS)"""
    q, k, v, p, drop = cache
    dv = (p if drop is None else p * drop).swapaxes(-1, -2) @ do
    dp = do @ v.swapaxes(-1, -2)
    if drop is not None:
        dp = dp * drop
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) / math.sqrt(q.shape[-1])    # softmax's backward
    return ds @ k, ds.swapaxes(-1, -2) @ q, dv


def attention_forward(q, k, v, drop=None, block=None, attn_mask=None, logits=None):
    """q, k, v (B, NH, T, HS) -> o (B, NH, T, HS), cache. ``drop``: dropout mask like P, or None.
    ``block``: query rows per block (default: engine_block; T: the plain one-block attention).
    ``attn_mask``: ops/masks.Mask (documents, sliding window), or None: plain causal.
    ``logits``: an (NH,) array that takes each head's largest score S (the masked ones are -inf) - what
    QK-clip watches (training/qk_clip.py); None: not asked (the one pass over S it costs).

    The 1/sqrt(HS) scale is applied to Q (T x HS) rather than to S (T x T): fewer multiplications.
    The softmax overwrites S (not needed again).  o is written as a (B, NH, T, HS) view of a
    (B, T, NH, HS) array, so that merge_heads afterwards is a reshape rather than a copy."""
    xp = array_module(q)
    B, NH, T, HS = q.shape
    q = q * (1.0 / math.sqrt(HS))                            # scaled Q, kept for the backward
    o = xp.empty((B, T, NH, HS), dtype=q.dtype).transpose(0, 2, 1, 3)
    plain = attn_mask is None or attn_mask.plain
    blocks = key_blocks(T, block or engine_block(q), None if plain else attn_mask)
    ps, acc = [], accumulator(q.dtype)
    for a, z, lo in blocks:
        s = gemm(q[:, :, a:z], k[:, :, lo:z].transpose(0, 1, 3, 2), dtype=acc)  # (B, NH, z - a, z - lo), fp32
        if plain:
            s[..., a:] += causal_mask(z - a, s.dtype, xp)    # the block's diagonal square
        else:
            s += attn_mask.additive(range(a, z), range(lo, z), s.dtype, xp)   # the rule, (B, 1, z - a, z - lo)
        if logits is not None:
            xp.maximum(logits, s.max(axis=(0, 2, 3)), out=logits)
        p = softmax_forward_fast(s, out=s)                   # P of the block, over S
        ps.append(p)
        gemm(_dropped(p, drop, a, z, lo, v.dtype), v[:, :, lo:z], out=o[:, :, a:z])
    return o, (q, k, v, ps, drop, blocks)


def attention_backward(do, cache, out=None):
    """do (B, NH, T, HS) -> dq, dk, dv (B, NH, T, HS)  (q in the cache is already scaled).

    ``out``: three (B, NH, T, HS) arrays, possibly strided views, to write dq, dk, dv into (the
    attention module passes views of one fused [dQ | dK | dV] array, saving three copies)."""
    q, k, v, ps, drop, blocks = cache
    xp = array_module(do)
    T = q.shape[2]
    dq, dk, dv = out if out is not None else (xp.empty(q.shape, dtype=q.dtype) for _ in range(3))
    acc = accumulator(q.dtype)
    summed = len(blocks) > 1 or not _whole(blocks[-1], T)    # dK, dV add up the blocks' shares
    low = acc != q.dtype and summed                           # ... in fp32
    sk, sv = (xp.empty(q.shape, acc) for _ in range(2)) if low else (dk, dv)
    part = xp.empty(q.shape, acc) if summed else None
    if not _whole(blocks[-1], T):                             # no block writes them whole: start at 0
        sk[...], sv[...] = 0, 0
    for (a, z, lo), p in zip(reversed(blocks), reversed(ps)):     # the last block sees every key: it writes
        doi, rows, whole = do[:, :, a:z], (slice(None), slice(None), slice(lo, z)), _whole((a, z, lo), T)
        pd = _dropped(p, drop, a, z, lo, v.dtype)
        into = sv if whole else part[rows]
        gemm(pd.transpose(0, 1, 3, 2), doi, out=into)        # dV = Pd^T dO, this block's share
        if not whole:
            sv[rows] += into
        dp = gemm(doi, v[:, :, lo:z].transpose(0, 1, 3, 2), dtype=acc)   # (B, NH, z - a, z - lo), fp32
        if drop is not None:
            dp *= drop[:, :, a:z, lo:z]
        ds = softmax_backward(dp, p).astype(q.dtype, copy=False)        # dL/dS, in place of dP
        gemm(ds, k[:, :, lo:z], out=dq[:, :, a:z])
        into = sk if whole else part[rows]
        gemm(ds.transpose(0, 1, 3, 2), q[:, :, a:z], out=into)          # dK = dS^T Q, its share
        if not whole:
            sk[rows] += into
    dq *= 1.0 / math.sqrt(q.shape[-1])                        # S = (scale Q) K^T
    if low:
        dk[...], dv[...] = sk, sv
    return dq, dk, dv


def attention_cached_forward(q, k, v, k_cache, v_cache, start, window=0):
    """Forward only, for generation: the new tokens at positions [start, start + T) attend to every
    cached token before them, and are themselves added to the KV cache.

    q (B, NH, T, HS), k, v (B, NKV, T, HS) of the new tokens; k_cache, v_cache (B, NKV, L, HS) hold
    the keys and values of positions [0, start) and receive k, v at [start, start + T).  Query i
    (position start + i) sees keys 0 .. start + i:  S = Q K_cache^T / sqrt(HS) + M, M[i, j] = -inf for
    j > start + i.  With start = 0 this is attention_forward; one new token at a time costs O(T_max)
    instead of O(T_max^2), which is what makes sampling a long text affordable.

    A sliding-window layer (``window`` W, ops/masks.py's rule) needs only the last W keys: its cache
    may be shorter than the text, L >= W slots, position p kept at slot p mod L (a ring buffer) - the
    keys of [start - L, start) are read from their slots in order, the new ones follow, and the last L
    of them overwrite the oldest.  The cache then costs O(W), however long the text grows.

    Grouped-query attention (ops/gqa.py) has NKV < NH: query head h reads K/V head h // (NH/NKV).  The
    query heads are viewed as NKV groups of NH/NKV, (B, NKV, NH/NKV, T, HS), and each cached K/V head is
    broadcast over its group - read, never copied.  NKV = NH is plain multi-head attention (GPT-2).
    -> o (B, NH, T, HS)"""
    xp = array_module(q)
    B, NH, T, HS = q.shape
    NKV, end, L = k.shape[1], start + T, k_cache.shape[2]
    if L >= end:                                                  # every position has its slot
        lo = 0
        k_cache[:, :, start:end] = k
        v_cache[:, :, start:end] = v
        keys, values = k_cache[:, :, :end], v_cache[:, :, :end]
    else:                                                         # a ring buffer of the last L positions
        lo = max(0, start - L)
        held = np.arange(lo, start) % L
        keys = xp.concatenate([k_cache[:, :, held], k], axis=2)
        values = xp.concatenate([v_cache[:, :, held], v], axis=2)
        last = slice(max(0, T - L), T)
        k_cache[:, :, np.arange(start, end)[last] % L] = k[:, :, last]
        v_cache[:, :, np.arange(start, end)[last] % L] = v[:, :, last]
    q = (q * (1.0 / math.sqrt(HS))).reshape(B, NKV, NH // NKV, T, HS)       # (B, NKV, group, T, HS)
    s = q @ keys[:, :, None].swapaxes(-1, -2)                                 # (B, NKV, group, T, end - lo)
    s += Mask(window=window).additive(range(start, end), range(lo, end), s.dtype, xp)
    o = softmax_forward(s, out=s) @ values[:, :, None]                        # (B, NKV, group, T, HS)
    return o.reshape(B, NH, T, HS)
