"""MPI ping-pong between ranks 0 and 1 through hpcpar.comm: prints {"latency": s, "bandwidth": B/s}.

Run as ``mpiexec -n 2 python -m hpcpar.plan.pingpong``.  Latency is half the round trip of an 8-byte
message; bandwidth is the bytes of a 16 MiB message over half its round trip, minus the latency
(the alpha-beta model: t = alpha + n / beta).  The best of several rounds is taken.
"""
import json
import time

import numpy as np
from mpi4py import MPI

from hpcpar.comm import Communicator


def half_round_trip(comm, nbytes, rounds):
    buf = np.zeros(nbytes, dtype=np.uint8)
    other = 1 - comm.rank
    best = float("inf")
    for _ in range(rounds):
        comm.barrier()
        t = time.perf_counter()
        if comm.rank == 0:
            comm.send(buf, other)
            comm.recv_(buf, other)
        else:
            comm.recv_(buf, other)
            comm.send(buf, other)
        best = min(best, (time.perf_counter() - t) / 2)
    return best


def main():
    comm = Communicator(MPI.COMM_WORLD, "world")
    if comm.size != 2:
        raise SystemExit("pingpong needs exactly 2 ranks")
    latency = half_round_trip(comm, 8, 200)
    big = 16 * 2**20
    t_big = half_round_trip(comm, big, 10)
    if comm.rank == 0:
        print(json.dumps({"latency": latency, "bandwidth": big / max(t_big - latency, 1e-9)}))


if __name__ == "__main__":
    main()
