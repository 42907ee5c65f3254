"""Ring attention's math: causal attention over one block of keys at a time, combined exactly.

Context parallelism gives each of cp ranks a part of the sequence.  A query needs every earlier key,
so the key/value blocks travel round a ring: at step s rank r holds the block of rank (r - s) mod cp
(``ring_source``), computes attention of its queries against it, and merges the result into what it
has.  No rank ever holds the (T, T) score matrix, only (T/cp, T/cp) pieces.

Forward of one block (queries at global positions qp, keys at kp; Qs = Q / sqrt(HS), the scaled Q):

    S = Qs K^T + M          M[i, j] = -inf where kp[j] > qp[i] (causal, by global position)
    m = max_j S             (a row that sees no key of this block: m = -inf, handled as 0)
    O_b = exp(S - m) V / l  l = sum_j exp(S - m)
    lse_b = m + log l       the log-sum-exp of the row's scores: -inf for a row that sees nothing

Online softmax: two partial results over disjoint key sets merge into the result over their union

    lse = log(exp(lse_1) + exp(lse_2))
    O   = exp(lse_1 - lse) O_1 + exp(lse_2 - lse) O_2

because O_b is a softmax-weighted mean and exp(lse_b) its normaliser.  After all cp blocks, lse is
the log of the full softmax's denominator and O the exact attention output.

Backward (flash-attention style) recomputes each block's probabilities from the saved final lse:

    P = exp(S - lse)        (the full softmax's entries for this block's keys; 0 where masked)
    D = rowsum(dO * O)      (= sum_j P_ij dP_ij over all keys, the softmax backward's subtraction)
    dV_b = P^T dO,   dP = dO V^T,   dS = P * (dP - D)
    dQs += dS K      (accumulates on the query's rank over the cp steps)
    dK_b = dS^T Qs   (belongs to the block's owner: travels the ring back to it)

Blocks are trimmed to the queries that see some key and the keys some query sees: with the
causal balance below, every block off the diagonal is exactly half of its (T/cp, T/cp) square.

Documents and sliding windows: the mask M is ops/masks.py's rule (``attn_mask``: same document, key not
after the query, within the window), by the tokens' window positions.  The trim is the same - the
queries of rank r that see some key of rank j's block, the keys some of them see (over the whole
micro-batch) - so a block that holds no key of any of r's queries' documents is skipped outright
and one that holds a few is cut to them.  The causal balance counts causal work, which documents
change: ``document_balance`` deals the sequence's chunks out again by the work the rule leaves in
each (``rank_work``: the query-key pairs a rank's queries see), keeping the causal balance unless
the other deal is lighter on its busiest rank.
"""
import math

import numpy as np

from hpcpar.backend import array_module
from hpcpar.ops.masks import Mask


def balanced_positions(seq_len, cp, rank):
    """The global positions rank ``rank`` of ``cp`` holds: the sequence is cut into 2 cp chunks and
    the rank takes chunks rank and 2cp-1-rank (one early, one late), so causal work is equal on
    every rank.  -> int64 array (seq_len / cp,), increasing."""
    c = seq_len // (2 * cp)                                  # chunk length
    first, second = rank, 2 * cp - 1 - rank
    return np.concatenate([np.arange(first * c, (first + 1) * c), np.arange(second * c, (second + 1) * c)])


def cp_positions(ctx, t_local, cp):
    """Every cp rank's window positions for this micro-batch: the context's deal (``document_balance``),
    else the causal balance."""
    given = getattr(ctx, "cp_positions", None)
    return given if given is not None else [balanced_positions(t_local * cp, cp, j) for j in range(cp)]


def ring_source(rank, step, cp):
    """Whose key/value block rank ``rank`` holds at ring step ``step`` (its own at step 0)."""
    return (rank - step) % cp


def visible(q_pos, k_pos, attn_mask=None):
    """(rows, cols): the queries that see at least one of the keys, the keys seen by at least one query
    (in any sequence of the micro-batch; ``attn_mask`` the rule, None: causal).  Slices when they are
    contiguous runs (increasing positions), index arrays otherwise."""
    def run(mask):
        idx = np.flatnonzero(mask)
        return slice(idx[0], idx[-1] + 1) if idx.size and idx[-1] - idx[0] + 1 == idx.size else idx
    if attn_mask is None or attn_mask.plain:            # causal: a query sees a key iff it is not before it
        return run(q_pos >= k_pos.min()), run(k_pos <= q_pos.max())
    seen = attn_mask.allowed(q_pos, k_pos).any(axis=0)                          # (Tq, Tk)
    return run(seen.any(axis=1)), run(seen.any(axis=0))


def skipped(rows):
    """Does no query see any key of the block?  (``visible``'s rows an empty index array)"""
    return isinstance(rows, np.ndarray) and rows.size == 0


def _scores(qs, k, q_pos, k_pos, attn_mask):
    """S = Qs K^T with -inf where the rule hides a key (after the query, another document, out of the
    window).  (B, NH, Tq, Tk)"""
    xp = array_module(qs)
    s = qs @ k.transpose(0, 1, 3, 2)
    s += (attn_mask or Mask()).additive(q_pos, k_pos, s.dtype, xp)          # (B or 1, 1, Tq, Tk)
    return s


def block_forward(qs, k, v, q_pos, k_pos, attn_mask=None, logits=None):
    """qs (B, NH, Tq, HS) scaled queries, k, v (B, NH, Tk, HS) -> (O_b (B, NH, Tq, HS), lse_b (B, NH, Tq)).
    Rows that see no key of the block get O_b = 0 and lse_b = -inf (they merge as nothing).  ``logits``
    (NH,) takes each head's largest score of the block (QK-clip), the rows' maxima m already at hand."""
    xp = array_module(qs)
    o = xp.zeros(qs.shape, dtype=qs.dtype)
    lse = xp.full(qs.shape[:-1], -xp.inf, dtype=qs.dtype)
    rows, cols = visible(q_pos, k_pos, attn_mask)
    if skipped(rows):
        return o, lse
    s = _scores(qs[:, :, rows], k[:, :, cols], q_pos[rows], k_pos[cols], attn_mask)    # (B, NH, tq, tk)
    m = s.max(axis=-1, keepdims=True)                   # a row that sees nothing in one sequence: -inf
    if logits is not None:
        xp.maximum(logits, m.max(axis=(0, 2, 3)), out=logits)
    m = xp.where(xp.isfinite(m), m, 0)
    p = xp.exp(s - m, out=s)
    l = p.sum(axis=-1, keepdims=True)                                        # (B, NH, tq, 1)
    some = l > 0
    o[:, :, rows] = (p @ v[:, :, cols]) / xp.where(some, l, 1)
    lse[:, :, rows] = xp.where(some, m + xp.log(xp.where(some, l, 1)), -xp.inf)[..., 0]
    return o, lse


def merge(o1, lse1, o2, lse2):
    """Two partial results over disjoint keys -> the result over both (online softmax).  A row with
    -inf in both stays -inf with O = 0."""
    xp = array_module(o1)
    lse = xp.logaddexp(lse1, lse2)                                           # (B, NH, Tq)
    safe = xp.where(xp.isfinite(lse), lse, 0)
    w1, w2 = xp.exp(lse1 - safe)[..., None], xp.exp(lse2 - safe)[..., None]
    return w1 * o1 + w2 * o2, lse


def block_backward(do, delta, qs, k, v, q_pos, k_pos, lse, attn_mask=None):
    """One block's share of the gradients, from the final lse and D = rowsum(dO * O) (B, NH, Tq).
    -> dQs (B, NH, Tq, HS) (w.r.t. the scaled queries), dK_b, dV_b (B, NH, Tk, HS)."""
    xp = array_module(qs)
    dqs, dk, dv = xp.zeros(qs.shape, dtype=qs.dtype), xp.zeros(k.shape, dtype=k.dtype), xp.zeros(v.shape, dtype=v.dtype)
    rows, cols = visible(q_pos, k_pos, attn_mask)
    if skipped(rows):
        return dqs, dk, dv
    q_b, k_b, v_b, do_b = qs[:, :, rows], k[:, :, cols], v[:, :, cols], do[:, :, rows]
    s = _scores(q_b, k_b, q_pos[rows], k_pos[cols], attn_mask)              # (B, NH, tq, tk)
    p = xp.exp(s - lse[:, :, rows, None], out=s)                             # P = exp(S - lse)
    dv[:, :, cols] = p.transpose(0, 1, 3, 2) @ do_b                         # dV_b = P^T dO
    ds = p * (do_b @ v_b.transpose(0, 1, 3, 2) - delta[:, :, rows, None])   # dS = P (dP - D)
    dqs[:, :, rows] = ds @ k_b                                               # dQs = dS K
    dk[:, :, cols] = ds.transpose(0, 1, 3, 2) @ q_b                         # dK_b = dS^T Qs
    return dqs, dk, dv


def scale(q):
    """Qs = Q / sqrt(HS): the scale applied to Q (Tq x HS numbers) rather than S."""
    return q * (1.0 / math.sqrt(q.shape[-1]))


def ring_plan(docs, cp, positions=None, window=0):
    """What each rank does at each ring step for one window whose tokens belong to documents ``docs``
    (T,): plan[r][s] = (j, queries, keys) - it holds rank j's block, of which ``keys`` are seen by
    ``queries`` of its own queries (the block trimmed to them), or (j, 0, 0): the block skipped.
    ``positions``: every rank's (default: the causal balance)."""
    positions = positions or [balanced_positions(len(docs), cp, r) for r in range(cp)]
    mask = Mask(np.asarray(docs)[None], window)
    return [[(j, *trimmed(positions[r], positions[j], mask)) for j in (ring_source(r, s, cp) for s in range(cp))]
            for r in range(cp)]


def trimmed(q_pos, k_pos, attn_mask=None):
    """(queries, keys) of a block as ``visible`` trims it: (0, 0) when it is skipped."""
    rows, cols = visible(q_pos, k_pos, attn_mask)
    return len(np.arange(len(q_pos))[rows]), len(np.arange(len(k_pos))[cols])


def block_entries(positions, rank, attn_mask=None):
    """(score entries rank ``rank``'s ring blocks compute under the rule, those they would compute under
    plain causal attention), per head, summed over the micro-batch's sequences."""
    B = 1 if attn_mask is None or attn_mask.docs is None else len(attn_mask.docs)
    return tuple(B * sum(np.prod(trimmed(positions[rank], k_pos, mask)) for k_pos in positions)
                 for mask in (attn_mask, None))


def rank_work(positions, attn_mask=None):
    """The attention work of each cp rank: the keys its queries see (the rule's query-key pairs),
    summed over the micro-batch's sequences.  ``positions``: every rank's window positions."""
    seen = (attn_mask or Mask()).keys_seen(sum(len(p) for p in positions))          # (B or 1, T)
    return [int(seen[:, p].sum()) for p in positions]


def document_balance(seq_len, cp, attn_mask=None):
    """Every cp rank's window positions for a micro-batch whose documents ``attn_mask`` holds: the
    causal balance (``balanced_positions``), unless dealing the 2 cp chunks (4 cp when they divide the
    sequence) out by their work - heaviest first, each to the lightest rank that still has room -
    leaves less on the busiest rank (``rank_work``).  Every rank computes the same deal from the same
    documents.  -> list of cp int64 arrays of seq_len / cp increasing positions."""
    causal = [balanced_positions(seq_len, cp, r) for r in range(cp)]
    if attn_mask is None or attn_mask.plain:
        return causal
    n = 4 * cp if seq_len % (4 * cp) == 0 else 2 * cp                      # chunks of c tokens
    c = seq_len // n
    work = attn_mask.keys_seen(seq_len).sum(axis=0).reshape(n, c).sum(axis=1)      # (n,)
    held, load = [[] for _ in range(cp)], [0] * cp
    for i in np.argsort(-work, kind="stable"):
        r = min((r for r in range(cp) if len(held[r]) < n // cp), key=lambda r: (load[r], r))
        held[r].append(i)
        load[r] += work[i]
    dealt = [np.concatenate([np.arange(i * c, (i + 1) * c) for i in sorted(h)]) for h in held]
    return dealt if max(rank_work(dealt, attn_mask)) < max(rank_work(causal, attn_mask)) else causal


def simulate_ring(q, k, v, positions, do=None, attn_mask=None):
    """The whole ring in one process, for tests and teaching: q, k, v lists over the cp ranks of
    (B, NH, T/cp, HS) arrays, ``positions`` their global positions, ``attn_mask`` the rule (documents,
    window; None: causal).  Each rank r merges the blocks in
    ring order r, r-1, ...; with ``do`` (the output gradients) each rank's backward runs too, its
    dK/dV shares summed on their owner as the ring would carry them.
    -> list of O, or (list of O, list of dQ, list of dK, list of dV)."""
    cp = len(q)
    outs, lses = [], []
    for r in range(cp):
        qs = scale(q[r])
        o, lse = block_forward(qs, k[r], v[r], positions[r], positions[r], attn_mask)
        for step in range(1, cp):
            j = ring_source(r, step, cp)
            o, lse = merge(o, lse, *block_forward(qs, k[j], v[j], positions[r], positions[j], attn_mask))
        outs.append(o)
        lses.append(lse)
    if do is None:
        return outs
    dq = [None] * cp
    dk = [np.zeros_like(x) for x in k]
    dv = [np.zeros_like(x) for x in v]
    for r in range(cp):
        qs, delta = scale(q[r]), (do[r] * outs[r]).sum(axis=-1)
        dqs = np.zeros_like(qs)
        for step in range(cp):
            j = ring_source(r, step, cp)
            a, b, c = block_backward(do[r], delta, qs, k[j], v[j], positions[r], positions[j], lses[r], attn_mask)
            dqs += a
            dk[j] += b
            dv[j] += c
        dq[r] = scale(dqs)                                   # dQ = dQs / sqrt(HS)
    return outs, dq, dk, dv
