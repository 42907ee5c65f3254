"""Exercise 22 (docs/course/13-recomputation.md): predict what recomputation keeps and runs again.

One GPT-2 block (pre-norm: LayerNorm, attention, LayerNorm, MLP), float64, no dropout:
batch B = 2, sequence T = 16, width C = 32, NH = 4 heads, MLP width 4 C.  Its forward returns a cache
that the backward needs; the three modes of hpcpar (--recompute-attention, --recompute):

    none        the cache holds every activation the backward uses
    selective   the attention core keeps only q, k, v; the backward runs the core's forward again
    full        the block keeps only what it needs to run its whole forward again in backward

Predict, in numbers (float64 values, not bytes):
    1. how many numbers the cache holds under full recomputation
    2. how many fewer numbers the cache holds under selective than under none
    3. how many times the attention forward (Q K^T, softmax, P V) runs for one forward + backward of the
       block under none, selective and full

Check: .venv/bin/hpcpar course check 22          (the command that measures it comes with a passed check)
"""

ANSWER = None      # (numbers under full, numbers selective saves, (forwards none, selective, full))
