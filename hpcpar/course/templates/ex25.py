"""Exercise 25 (docs/course/16-all-to-all.md): the MoE dispatch and combine.

A router chose for each of N tokens k of E experts: idx (N, k) integer expert ids, with weights
w (N, k).  Assignment a = t k + j is token t's j-th choice.  E experts sit on ep ranks, E/ep
consecutive experts each.  Return (order, send, y):
  order (N k,)  the assignments in the order that makes each expert's rows contiguous (expert 0's first),
                in token order within an expert
  send (ep,)    how many rows go to each rank (the all-to-all's send counts)
  y (N, C)      the combine: given ye (N k, C), the experts' output rows in that order, each token's
                sum over its choices of weight x its expert's output row

Check: .venv/bin/hpcpar course check 25
"""


def dispatch_combine(idx, w, n_expert, ep, ye):
    """-> (order (N k,), send (ep,), y (N, C))"""
    raise NotImplementedError
