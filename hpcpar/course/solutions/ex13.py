"""Exercise 13, a solution: the ring all-reduce on MPI ranks, non-blocking."""
import numpy as np

from hpcpar.comm import wait_all


def ring_allreduce(x, comm):
    p, r = comm.size, comm.rank
    chunks = x.reshape(p, -1)
    incoming = np.empty_like(chunks[0])
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(p - 1):
            shift = s if phase == "reduce-scatter" else s - 1
            out, into = (r - shift) % p, (r - shift - 1) % p
            wait_all([comm.irecv_(incoming, (r - 1) % p), comm.isend(chunks[out], (r + 1) % p)])
            if phase == "reduce-scatter":
                chunks[into] += incoming
            else:
                chunks[into] = incoming
    return x
