"""Exercise 44 (docs/course/17-muon.md): which rank owns which matrix, and what each hands MPI.

Muon under ZeRO needs every matrix whole on one rank of the data-parallel group (its *owner*).  The
group's flat buffers, one after the other, each hold some matrices (``buffers``: a list per buffer of
their sizes, in numbers).  Within a buffer the matrices go out longest first, each to the rank that
owns the fewest numbers so far - counting what it owns in the earlier buffers too - the lowest rank on
a tie (equal sizes keep their order).  Then each buffer is laid out as n equal ranges, rank r's
matrices in range r, each range as long as the fullest rank's matrices in that buffer (the rest is
padding).

Return (owners, handed): owners[i][j] the rank that owns matrix j of buffer i; handed[r] the numbers
rank r hands MPI in one ZeRO-1 step for these buffers - the gradients' reduce-scatter (it hands the
whole buffer) and the updated values' all-gather (it hands its range).  n ranks, n >= 2.

Check: .venv/bin/hpcpar course check 44
"""


def ownership(buffers, n):
    raise NotImplementedError
