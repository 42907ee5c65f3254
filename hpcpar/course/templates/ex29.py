"""Exercise 29 (docs/course/01-one-rank.md): causal attention in blocks of query rows.

Causal attention, per head, for q, k, v (B, NH, T, HS) float64:

    S = Q K^T / sqrt(HS) + M        M[i, j] = -inf for a key j after the query i (j > i), else 0
    P = softmax(S)                  over the keys: the last axis
    O = P V

Above the diagonal P is exactly 0, so computing it there is wasted work.  Cut the queries into blocks
of `block` rows, [0, block), [block, 2 block), ... (the last one may be shorter), and compute each
block's rows of S, P and O from only the keys and values its queries see.

Return (o, ps): o (B, NH, T, HS), and ps the list of the blocks' P, in block order - what a backward
would keep - each (B, NH, rows of the block, keys the block sees).  numpy only.

Check: .venv/bin/hpcpar course check 29
"""
import numpy as np  # noqa: F401


def causal_blocks_forward(q, k, v, block):
    """-> (o (B, NH, T, HS), [P of each block of query rows])"""
    raise NotImplementedError
