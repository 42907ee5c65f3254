"""Exercise 12 (docs/course/08-tracing.md): communication hidden behind compute.

A trace gives a rank's communication intervals and its compute intervals; intervals of one kind may
overlap each other (two buckets in flight at once, say).  What share of the communication time had compute running at the same moment?  0 when no
communication is hidden, 1 when all of it is.

Check: .venv/bin/hpcpar course check 12
"""


def hidden_share(comm, compute):
    """comm, compute: lists of (start, end). Returns a float in [0, 1]."""
    raise NotImplementedError
