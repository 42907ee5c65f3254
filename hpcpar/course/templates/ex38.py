"""Exercise 38 (docs/course/09-context-parallel.md): the blocks ring attention skips for a window of documents.

Ring attention over cp ranks, the sequence of T tokens cut by the causal balance (exercise 17: rank j
holds chunks j and 2 cp - 1 - j of T / (2 cp) positions each); at step s rank r holds the key/value block
of rank (r - s) mod cp.  With --documents, `docs` (T,) gives each position of the window its document id
(non-decreasing), and the query at window position q sees the key at window position k only if

    k <= q,    docs[k] == docs[q],    and, with a sliding window of W keys (window > 0), q - k < W

At each step a rank computes its queries that see some key of the block it holds against the keys that
some of them see (the block trimmed to them), or skips the block when no query of it sees any of its keys.

Return plan: cp lists, one a rank, each of cp tuples, one a step: plan[r][s] = (j, queries, keys) - rank r
holds rank j's block at step s, and computes `queries` of its own T / cp queries against `keys` of the
block's T / cp keys; (j, 0, 0) when it skips the block.

Check: .venv/bin/hpcpar course check 38
"""


def ring_plan(docs, cp, window=0):
    """docs: T document ids; -> plan[rank][step] = (j, queries, keys)"""
    raise NotImplementedError
