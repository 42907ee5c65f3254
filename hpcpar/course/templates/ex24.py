"""Exercise 24 (docs/course/15-v-pipelines.md): ZB-V's order for one rank.

Rank `rank` of `stages` holds two chunks: chunk 0 is stage `rank` on the way down the V, chunk 1 is
stage 2 * stages - 1 - rank on the way back up (rank 0 holds the first stage and the loss).  Return
the order in which it runs, for micro-batches 0 .. microbatches - 1 (at least 2 * stages - 1 of
them), ("F", mb, chunk), ("B", mb, chunk) (the input gradient) and ("W", mb, chunk) (the weight
gradient).  The check builds every rank's order, refuses one that can hang (the hang checker), and
simulates it at F = B = W: no rank may idle longer, or hold more activations, than ZB-V.

Check: .venv/bin/hpcpar course check 24
"""


def zb_v(rank, stages, microbatches):
    """A list of (op, mb, chunk) triples."""
    raise NotImplementedError
