"""Documents in a packed window: the positions that restart at each document and the targets that stay in
the loss (hpcpar/ops/masks.py, docs/own_data.md section 4), and which key/value blocks ring attention skips
at each step for the window's documents (hpcpar/ops/ring_attention.py, docs/context_parallel.md)."""
import numpy as np

from hpcpar.course.wrong import Wrong
from hpcpar.ops.masks import documents_of, kept_targets, restart_positions
from hpcpar.ops.ring_attention import ring_plan


def packed_window(docs):
    """Reference: docs (B, T + 1), the document ids of a window's T inputs and its last target ->
    (positions (B, T): each input's place in its piece of document, kept (B, T): the targets that stay
    in the loss)."""
    docs = np.asarray(docs)
    return restart_positions(docs[:, :-1]), kept_targets(docs)


def _windows():
    """(what, docs (B, T + 1)): the edges first, then windows cut out of a stream of documents as
    `hpcpar train` cuts them (ops/masks.documents_of: ids counted from 0 at each window's start)."""
    yield "one document", np.zeros((1, 9), np.int64)
    yield "the picture of own_data.md", np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    yield "the last target starts a document", np.array([[0, 0, 0, 0, 1]])
    yield "every token a document of its own", np.array([[0, 1, 2, 3, 4]], np.int32)
    yield "two sequences, the second beginning with id 0 as the first one ends", \
        np.array([[0, 0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 1, 2, 2]])
    yield "three sequences whose documents share ids", \
        np.array([[0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 1, 1, 1]])
    yield "windows of one token", np.array([[0, 0], [0, 1]])
    rng = np.random.default_rng(34)
    starts = np.concatenate([[0], np.cumsum(rng.integers(1, 9, 40))])
    for B, T in ((4, 16), (3, 33)):
        firsts = rng.integers(0, starts[-1] - T - 1, B)
        yield f"{B} windows of {T} tokens from a stream", np.stack([documents_of(starts, f, T + 1) for f in firsts])


def check_packed_window(f):
    for what, docs in _windows():
        want_pos, want_kept = packed_window(docs)
        got = f(docs.copy())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return two arrays: (positions, kept)")
        pos, kept = (np.asarray(a) for a in got)
        where = f"{what}, docs {docs.tolist()}"
        for name, g, w in (("positions", pos, want_pos), ("kept", kept, want_kept)):
            if g.shape != w.shape:
                raise Wrong(f"{where}: {name} has shape {g.shape}, expected {w.shape} (B, T): one per input")
        if kept.dtype != bool:
            raise Wrong(f"{where}: kept has dtype {kept.dtype}: return booleans (True: the target stays in the loss)")
        for name, g, w in (("positions", pos, want_pos), ("kept", kept, want_kept)):
            bad = np.argwhere(g != w)
            if len(bad):
                b, t = (int(i) for i in bad[0])
                raise Wrong(f"{where}: {name}[{b}, {t}] is {g[b, t]}, expected {w[b, t]}")


# --- exercise 38: the ring's plan for a window of documents -----------------------------------------------

def _plans():
    """(cp, docs (T,), window): the worked examples of context_parallel.md, then windows and cp sizes that
    catch each way of getting it wrong."""
    yield 2, [0, 0, 0, 0, 1, 1, 1, 1], 0
    yield 2, [0, 0, 0, 0, 0, 0, 0, 0], 0
    yield 2, [0, 0, 1, 1, 2, 2, 3, 3], 0
    yield 4, [0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3], 0
    yield 4, [0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3], 3
    yield 2, [0] * 16, 4
    yield 1, [0, 0, 1, 1], 0
    rng = np.random.default_rng(35)
    for cp, T, window in ((3, 24, 0), (3, 12, 2), (4, 32, 5), (4, 48, 0), (2, 20, 1)):
        yield cp, np.cumsum(rng.random(T) < 0.25).tolist(), window


def check_ring_plan(f):
    for cp, docs, window in _plans():
        want = ring_plan(docs, cp, window=window)
        where = f"cp {cp}, window {window or 'none'}, documents {docs}"
        got = f(list(docs), cp, window=window)
        if len(got) != cp or any(len(row) != cp for row in got):
            raise Wrong(f"{where}: return cp lists (one a rank) of cp steps each")
        for r in range(cp):
            for s in range(cp):
                g, w = tuple(int(x) for x in got[r][s]), want[r][s]
                if g == w:
                    continue
                why = "the block of another rank" if g[0] != w[0] else \
                    "a block skipped that some queries see" if g[1:] == (0, 0) else \
                    "a block computed that no query sees" if w[1:] == (0, 0) else "the block trimmed otherwise"
                raise Wrong(f"{where}: rank {r}, step {s} is {g}, expected {w} - {why}")
