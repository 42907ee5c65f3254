"""Exercise 13 (docs/course/02-collectives.md): a ring all-reduce on real MPI ranks.

`hpcpar course check 13` starts 4 ranks (mpiexec -n 4) and runs your ring on all 4, then on 3 of them
and on pairs: each rank calls ring_allreduce(x, comm) with its own array x (float64, length divisible
by p = comm.size) and a hpcpar Communicator over the ranks of the ring.  Sum
the arrays of all ranks into x along the ring of exercise 1 - this rank's part of it: p - 1
reduce-scatter steps, then p - 1 all-gather steps, one chunk of n/p numbers to rank + 1 and one from
rank - 1 at each step.  Use non-blocking point-to-point calls:

    req = comm.isend(array, dest, tag=0)        send (do not modify array until it completes)
    req = comm.irecv_(out, source, tag=0)       receive into out (valid after the wait)
    wait_all([req, ...])                        from hpcpar.comm import wait_all

No collectives (comm.all_reduce ...): the check compares your sums with MPI's Allreduce, and follows
your messages - where each goes, how many bytes, and whether every request you post completes.

Check: .venv/bin/hpcpar course check 13
"""
import numpy as np  # noqa: F401

from hpcpar.comm import wait_all  # noqa: F401


def ring_allreduce(x, comm):
    """Returns the sum over ranks (x itself, summed in place, or a new array)."""
    raise NotImplementedError
