"""Exercise 8 (docs/course/06-3d.md): a rank's coordinates on the grid.

hpcpar numbers the ranks of a tp x pp x dp grid in the order tp-dp-pp, fastest first: consecutive ranks
share a TP group, then the DP replicas follow, then the pipeline stages.  Return (tp_i, pp_i, dp_i)
of `rank`.

Check: .venv/bin/hpcpar course check 8          See: .venv/bin/hpcpar grid --tp 2 --pp 2 --dp 2 --world 8
"""


def coords(rank, tp, pp, dp):
    raise NotImplementedError
