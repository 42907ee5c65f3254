"""MPI between ranks 0 and 1 through hpcpar.comm: point-to-point and the data-parallel all-reduce.

Run as ``mpiexec -n 2 python -m hpcpar.tools.plan.pingpong``; prints {"latency", "bandwidth", "dp_latency",
"dp_bandwidth"} (seconds, bytes/s).  The alpha-beta model, t = alpha + n / beta:

* ping-pong: latency is half the round trip of an 8-byte message; bandwidth is the bytes of a 16 MiB
  message over half its round trip, minus the latency (the pipeline's activations and gradients);
* data parallel: gradients go as data_parallel/replicas.py sends them - an ``iall_reduce_`` per bucket of
  BUCKET bytes, all started, then one ``wait_all``.  dp_latency is the time of one 8-byte bucket;
  dp_bandwidth the bytes of 16 MiB (4 buckets) over their time less 4 latencies.  On CPUs this
  includes the reduction arithmetic and MPI's copies, so it is well below the ping-pong bandwidth.

The best of several rounds is taken.
"""
import json
import time

import numpy as np
from mpi4py import MPI

from hpcpar.comm import Communicator, wait_all

BUCKET = 4 * 2**20        # bytes, the engine's default --bucket-mb 4
BIG = 16 * 2**20


def _best(comm, fn, rounds):
    best = float("inf")
    for _ in range(rounds):
        comm.barrier()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def half_round_trip(comm, nbytes, rounds):
    buf = np.zeros(nbytes, dtype=np.uint8)
    other = 1 - comm.rank

    def ping():
        if comm.rank == 0:
            comm.send(buf, other)
            comm.recv_(buf, other)
        else:
            comm.recv_(buf, other)
            comm.send(buf, other)
    return _best(comm, ping, rounds) / 2


def bucket_all_reduce(comm, nbytes, rounds):
    """Seconds to all-reduce ``nbytes`` of float32 gradients in buckets, as the engine does."""
    buckets = [np.ones(min(BUCKET, nbytes - i) // 4, dtype=np.float32) for i in range(0, nbytes, BUCKET)]
    return _best(comm, lambda: wait_all([comm.iall_reduce_(b) for b in buckets]), rounds)


def main():
    comm = Communicator(MPI.COMM_WORLD, "world")
    if comm.size != 2:
        raise SystemExit("pingpong needs exactly 2 ranks")
    latency = half_round_trip(comm, 8, 200)
    t_big = half_round_trip(comm, BIG, 10)
    dp_latency = bucket_all_reduce(comm, 8, 100)
    t_dp = bucket_all_reduce(comm, BIG, 10)
    if comm.rank == 0:
        print(json.dumps({"latency": latency, "bandwidth": BIG / max(t_big - latency, 1e-9),
                          "dp_latency": dp_latency,
                          "dp_bandwidth": BIG / max(t_dp - BIG // BUCKET * dp_latency, 1e-9)}))


if __name__ == "__main__":
    main()
