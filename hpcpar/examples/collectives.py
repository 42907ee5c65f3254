"""The six communication patterns on 4 ranks, with mpi4py's buffer calls, and the all-to-all exchanges of
hpcpar.comm (docs/collectives.md).

    .venv/bin/mpiexec -n 4 .venv/bin/python -m hpcpar.examples.collectives

Rank r starts with x_r = 10 r + (0, 1, 2, 3).  Each pattern prints what every rank holds before and
after, checks it against numpy, and says how many bytes each rank sent.  Then the cost model: alpha
(latency) and beta (seconds per byte) measured with a ping-pong between ranks 0 and 1, and each
collective on 1 MiB per rank timed against its formula (hpcpar/course/collectives.py).
"""
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcpar.course.collectives import COLLECTIVES, bytes_sent_per_rank, cost
from hpcpar.examples._common import once, rank_by_rank, require_size, vec

N = 4                                              # numbers per rank in the small demonstrations


def _start(rank):
    return 10.0 * rank + np.arange(N)              # (N,) float64


def run_pattern(comm, name):
    """(what this rank held before, what it holds after) for one collective."""
    r, p = comm.rank, comm.size
    x = _start(r)
    if name == "send/recv":                        # rank 0 -> rank 1; the others watch
        out = x.copy()
        if r == 0:
            comm.Send(x, dest=1, tag=7)
        elif r == 1:
            comm.Recv(out, source=0, tag=7)
    elif name == "broadcast":                      # rank 0's array everywhere
        out = x.copy()
        comm.Bcast(out, root=0)
    elif name == "reduce":                         # the sum, on rank 0 only
        out = np.zeros(N) if r == 0 else x.copy()
        comm.Reduce(x, out if r == 0 else None, op=MPI.SUM, root=0)
    elif name == "all-reduce":                     # the sum, everywhere
        out = np.empty(N)
        comm.Allreduce(x, out, op=MPI.SUM)
    elif name == "all-gather":                     # each rank's first number, side by side, everywhere
        x = x[:1].copy()
        out = np.empty(p)
        comm.Allgather(x, out)
    else:                                          # reduce-scatter: element r of the sum, on rank r
        out = np.empty(N // p)
        comm.Reduce_scatter_block(x, out, op=MPI.SUM)
    return x, out


def expected(name, rank, p):
    xs = [_start(r) for r in range(p)]
    total = sum(xs)
    return {"send/recv": xs[0] if rank == 1 else xs[rank], "broadcast": xs[0],
            "reduce": total if rank == 0 else xs[rank], "all-reduce": total,
            "all-gather": np.array([x[0] for x in xs]), "reduce-scatter": total[rank:rank + 1]}[name]


def demonstrate(comm):
    """Every pattern once, rank by rank; returns True when every rank holds what numpy says."""
    right = True
    for name in COLLECTIVES:
        before, after = run_pattern(comm, name)
        ok = np.array_equal(after, expected(name, comm.rank, comm.size))
        right = bool(comm.allreduce(ok, op=MPI.LAND)) and right
        sent = bytes_sent_per_rank(name, before.nbytes if name != "all-gather" else before.nbytes * comm.size,
                                   comm.size)
        once(comm, f"{name}: each rank sends about {sent:g} bytes (busiest rank)")
        rank_by_rank(comm, [f"{vec(before)} -> {vec(after)}"])
    return right


def exchange(comm):
    """all_to_all and all_to_allv through hpcpar.comm, rank by rank; returns True when every rank holds
    what numpy says.  all-to-all: part j of x_r goes to rank j (a transpose of rank and part).
    all-to-allv: number 10 r + k is a token routed to rank (r * k) mod p, as tokens go to the rank of
    their expert: each rank sends its tokens sorted by destination, uneven counts, learnt first."""
    from hpcpar.comm import Communicator
    hp, r, p = Communicator(comm, "world"), comm.rank, comm.size
    x = _start(r)
    after = hp.all_to_all(x)
    right = np.array_equal(after, [_start(q)[r] for q in range(p)])
    once(comm, "all-to-all (hpcpar.comm all_to_all): part j of rank r goes to rank j")
    rank_by_rank(comm, [f"{vec(x)} -> {vec(after)}"])
    dest = (r * np.arange(N)) % p
    order = np.argsort(dest, kind="stable")
    routed = hp.all_to_allv(x[order], np.bincount(dest, minlength=p))
    want = [t for q in range(p) for k, t in enumerate(_start(q)) if (q * k) % p == r]
    right = np.array_equal(routed, want) and right
    once(comm, "all-to-allv (hpcpar.comm all_to_allv): token 10 r + k goes to rank (r * k) mod 4")
    rank_by_rank(comm, [f"{vec(x)} -> {vec(routed)}"])
    return bool(comm.allreduce(right, op=MPI.LAND))


def _best(comm, fn, repeats):
    """Best time over ``repeats`` calls of fn, each started together (a barrier) and ended by the slowest rank."""
    best = float("inf")
    for _ in range(repeats):
        comm.Barrier()
        t = time.perf_counter()
        fn()
        best = min(best, comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return best


def pingpong(comm, nbytes, repeats=20):
    """One-way time of an nbytes message between ranks 0 and 1 (half a round trip)."""
    buf = np.zeros(max(1, nbytes // 8))

    def roundtrip():
        if comm.rank == 0:
            comm.Send(buf, dest=1)
            comm.Recv(buf, source=1)
        elif comm.rank == 1:
            comm.Recv(buf, source=0)
            comm.Send(buf, dest=0)
    return _best(comm, roundtrip, repeats) / 2


def measure(comm, nbytes=1 << 20):
    """alpha and beta from ping-pongs, then each collective measured against its formula."""
    alpha = pingpong(comm, 8)
    beta = (pingpong(comm, nbytes) - alpha) / nbytes
    once(comm, f"\ncost model from ping-pongs between ranks 0 and 1: alpha {alpha * 1e6:.1f} us, "
               f"bandwidth {1 / beta / 1e9:.2f} GB/s")
    once(comm, f"{'collective':<16} {'measured':>12} {'formula':>12}   (1 MiB per rank, {comm.size} ranks)")
    n = nbytes // 8
    x, out, big = np.ones(n), np.empty(n), np.empty(n * comm.size)
    calls = {
        "send/recv": lambda: comm.Send(x, dest=1) if comm.rank == 0 else
        (comm.Recv(out, source=0) if comm.rank == 1 else None),
        "broadcast": lambda: comm.Bcast(out, root=0),
        "reduce": lambda: comm.Reduce(x, out, op=MPI.SUM, root=0),
        "all-reduce": lambda: comm.Allreduce(x, out, op=MPI.SUM),
        "all-gather": lambda: comm.Allgather(x, big),
        "reduce-scatter": lambda: comm.Reduce_scatter_block(big, out, op=MPI.SUM),
    }
    for name in COLLECTIVES:
        size = nbytes * comm.size if name in ("all-gather", "reduce-scatter") else nbytes
        measured = _best(comm, calls[name], 5)
        once(comm, f"{name:<16} {measured * 1e3:9.2f} ms {cost(name, size, comm.size, alpha, beta) * 1e3:9.2f} ms")


def main():
    comm = MPI.COMM_WORLD
    require_size(comm, 4, "collectives")
    right = demonstrate(comm)
    right = exchange(comm) and right
    once(comm, "every rank holds what numpy computes: " + ("yes" if right else "NO"))
    measure(comm)
    return 0 if right else 1


if __name__ == "__main__":
    from hpcpar.runtime import run_guarded
    sys.exit(run_guarded(main))
