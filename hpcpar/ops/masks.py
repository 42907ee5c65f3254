"""Which keys a query sees: the one mask rule of every attention in hpcpar (the blocks of
ops/attention.py, ring attention's, Ulysses' core, generation's KV cache) and of the counts of its work.

A training window of T tokens may hold pieces of several documents (packing).  ``docs`` (B, T) gives
each position the id of its document, non-decreasing along the window (a piece of a document is a run
of equal ids); positions are the window's, 0 .. T-1, whatever rank holds them.  Query q sees key k iff

    k <= q                      causal
    docs[k] == docs[q]          the same document (block-diagonal causal: no attention across a join)
    q - k < W                   within the sliding window of W keys (W = 0: no window)

Drawn for a window of 8 holding documents [0, 3), [3, 8), with W = 0 and with W = 2 (x: seen):

    docs  0 0 0 1 1 1 1 1         no window             W = 2
    q=0   x . . . . . . .         x . . . . . . .       x . . . . . . .
    q=1   x x . . . . . .         x x . . . . . .       x x . . . . . .
    q=2   x x x . . . . .         x x x . . . . .       . x x . . . . .
    q=3   x x x x . . . .   ->    . . . x . . . .       . . . x . . . .
    q=4   x x x x x . . .         . . . x x . . .       . . . x x . . .
    ...   (plain causal)          (block-diagonal)      (and banded)

Every query sees at least itself, so no softmax row is empty.  The keys a block of consecutive
queries [a, z) sees form one run [lo, z): lo is the start of query a's document (or a - W + 1 if
later), because the later queries' documents start later still - so a query block skips, exactly,
the key blocks before ``first_key``.  Each document restarts its positions at 0 (``restart_positions``:
the learned position table and RoPE read these), and the target of the last token of a document - the
next document's first token, which nothing in the window can predict - is left out of the loss unless
asked for (``kept_targets``, Megatron's ``--eod-mask-loss``).

The window of each layer (``windowed_layers``): every layer, or the ones a slice or list names
("::2": every other layer from the first, as gpt-oss alternates; "4:" from layer 4 on, as Qwen's
``max_window_layers``).
"""
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from hpcpar.runtime import UsageError


def visible(q_doc, q_pos, k_doc, k_pos, window=0):
    """THE rule: may the query at window position q_pos (of document q_doc) see the key at k_pos (of
    k_doc)?  Broadcasts like numpy: (B, Tq, 1) against (B, 1, Tk) gives (B, Tq, Tk)."""
    seen = (k_pos <= q_pos) & (k_doc == q_doc)
    return seen & (q_pos - k_pos < window) if window else seen


@dataclass(frozen=True)
class Mask:
    """The rule for one attention layer and micro-batch: the window's documents (None: one document)
    and the layer's sliding window (0: none)."""
    docs: Any = None          # (B, T) int document ids of the window's positions, host array
    window: int = 0

    @property
    def plain(self):
        """Plain causal attention: one document, no window (the fast path of ops/attention.py)."""
        return self.docs is None and not self.window

    def allowed(self, q_pos, k_pos):
        """Boolean (B or 1, Tq, Tk): which of the keys at window positions k_pos (T_k,) each query at
        q_pos (T_q,) sees (positions: index arrays into the window)."""
        q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
        if self.docs is None:
            return visible(0, q_pos[None, :, None], 0, k_pos[None, None, :], self.window)
        return visible(self.docs[:, q_pos][:, :, None], q_pos[None, :, None],
                       self.docs[:, k_pos][:, None, :], k_pos[None, None, :], self.window)

    def additive(self, q_pos, k_pos, dtype, xp):
        """The rule as scores add it: 0 where seen, -inf elsewhere, (B or 1, 1, Tq, Tk) on ``xp``."""
        return xp.asarray(np.where(self.allowed(q_pos, k_pos), 0.0, -np.inf)[:, None], dtype=dtype)

    @cached_property
    def places(self):
        """(B, T) each position's place in its document (``restart_positions``), computed once."""
        return restart_positions(self.docs)

    def keys_seen(self, T):
        """(B or 1, T): how many keys each query sees - its place in its document plus one, at most W."""
        seen = 1 + (np.arange(T)[None] if self.docs is None else self.places)
        return np.minimum(seen, self.window) if self.window else seen

    def first_key(self, a):
        """The earliest key any query from position a on sees (in any sequence of the batch): the
        start of a's document, or the window's edge a - W + 1 when that is later."""
        lo = 0 if self.docs is None else int((a - self.places[:, a]).min())
        return max(lo, a - self.window + 1) if self.window else lo


def restart_positions(docs):
    """docs (B, T) -> (B, T): each token's position in its own piece of document (0 at each start;
    the first piece of the window, begun before it, counts from the window's start)."""
    T = docs.shape[-1]
    t = np.broadcast_to(np.arange(T), docs.shape)
    starts = np.concatenate([np.ones(docs.shape[:-1] + (1,), bool), docs[..., 1:] != docs[..., :-1]], axis=-1)
    return t - np.maximum.accumulate(np.where(starts, t, 0), axis=-1)


def token_positions(docs, positions, T):
    """The positions the position table and RoPE read for the T tokens a rank holds, at window
    positions ``positions`` (None: 0 .. T-1): those positions themselves, or with documents (B, T) the
    places in their documents (``restart_positions``)."""
    if docs is None:
        return np.arange(T) if positions is None else positions
    restarted = restart_positions(docs)
    return restarted if positions is None else restarted[:, positions]


def kept_targets(docs):
    """docs (B, T + 1) of the window's inputs and its last target -> (B, T) bool: the targets that stay
    in the loss, those whose token is in the same document as the input that predicts it."""
    return docs[:, 1:] == docs[:, :-1]


def documents_of(starts, first, length):
    """Document ids (length,) of the tokens first .. first + length - 1 of a stream whose documents
    begin at ``starts`` (sorted, starts[0] = 0), counted from 0 at ``first``."""
    idx = np.searchsorted(starts, np.arange(first, first + length), side="right")
    return idx - idx[0]


def document_lengths(docs):
    """docs (T,) of one window -> the lengths of its pieces of documents, in order."""
    return np.diff(np.flatnonzero(np.concatenate([[True], docs[1:] != docs[:-1], [True]])))


def windowed_layers(spec, n_layer):
    """The layers that use the sliding window: "" every layer, a slice "start:stop:step" or a list
    "0,2,5" of layer indexes."""
    layers = range(n_layer)
    try:
        if not spec:
            return tuple(layers)
        if ":" in spec:
            return tuple(layers[slice(*(int(x) if x else None for x in spec.split(":")))])
        chosen = tuple(sorted({int(x) for x in spec.split(",")}))
    except ValueError:
        raise UsageError(f"--window-layers {spec!r}: give a slice like ::2 or 4: or a list like 0,2,5") from None
    if chosen and not 0 <= chosen[0] <= chosen[-1] < n_layer:
        raise UsageError(f"--window-layers {spec!r} names a layer outside 0 .. {n_layer - 1}")
    return chosen
