"""Exercise 16 (docs/course/09-context-parallel.md): merge two online-softmax partial results.

Ring attention computes a query's attention one key/value block at a time.  Over block b it gets

    O_b    (B, NH, Tq, HS)   the softmax-weighted mean of the block's values (softmax over its keys only)
    lse_b  (B, NH, Tq)       log of that softmax's denominator: log sum_j exp(s_j); -inf for a query
                             that sees none of the block's keys (its O_b row is 0)

Return (O, lse) over the keys of both blocks: the attention the query would get from all of them.
Scores can be large (lse of 800: exp overflows float64), and some rows are -inf in one block or both.

Check: .venv/bin/hpcpar course check 16
"""
import numpy as np  # noqa: F401


def merge(o1, lse1, o2, lse2):
    raise NotImplementedError
