"""Exercise 37 (docs/course/09-context-parallel.md): a packed window's positions, and the targets kept.

`hpcpar data prepare` ends every document with its <|endoftext|> token and joins them into one stream;
training cuts windows of T tokens out of it wherever they fall, so a window may hold the end of one
document and the start of others.  With --documents every micro-batch carries the document id of each of
its tokens: `docs` (B, T + 1) int, docs[b, :T] the ids of sequence b's T inputs and docs[b, T] the id of
its last target (the target of input t is token t + 1).  Ids are counted from 0 at each window's start
and never decrease along a window: a piece of a document is a run of equal ids.

Return (positions, kept), both (B, T):

    positions[b, t]   the position the position table and RoPE read for input t of sequence b, as
                      --documents gives it (the reading: docs/own_data.md, section 4)
    kept[b, t]        bool: does target t stay in the loss?

numpy only.

Check: .venv/bin/hpcpar course check 37
"""
import numpy as np  # noqa: F401


def packed_window(docs):
    """docs (B, T + 1) -> (positions (B, T) int, kept (B, T) bool)"""
    raise NotImplementedError
