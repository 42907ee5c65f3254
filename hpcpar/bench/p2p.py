"""(b) Point-to-point latency and bandwidth, OSU style: hpcpar.comm against raw mpi4py, 8 B to 64 MB.

A ping-pong between ranks 0 and 1 (the OSU micro-benchmarks' latency test): rank 0 sends a message
and waits for it to come back, ``iters`` times; one-way time = elapsed / (2 iters), bandwidth =
message size / one-way time.  "raw" is mpi4py's buffer-based ``Send``/``Recv`` on preallocated numpy
arrays - the floor of what Python can do with this MPI; "hpcpar" is ``Communicator.send``/``recv_``,
which adds the contiguity check, the counters and the device-buffer test.  The two take turns at every
size (rotating order), and each keeps its best round.  Target (issue 8): hpcpar >= 0.95x raw bandwidth
at 1 MB and above.
"""
import time

import numpy as np
from mpi4py import MPI

from hpcpar.bench.common import Result, interleave, ratio, rate, size, slowest_rank, us
from hpcpar.comm import Communicator

SIZES = [8 * 8 ** i for i in range(8)] + [16 * 2 ** 20, 64 * 2 ** 20]      # 8 B, 64 B, ..., 16 MB, 64 MB
QUICK_SIZES = [8, 4096, 2 ** 20]


def iterations(nbytes, quick):
    """Round trips per timed round: many for tiny messages (timer resolution), few for big ones."""
    budget = 2e-3 if quick else 2e-2                       # seconds per round, at ~5 GB/s
    return int(max(2, min(1000, budget / (2e-6 + nbytes / 5e9))))


def pingpong(send, recv, buf, other, iters, first):
    def run():
        for _ in range(iters):
            if first:
                send(buf, other)
                recv(buf, other)
            else:
                recv(buf, other)
                send(buf, other)
    return run


def run(quick):
    world = MPI.COMM_WORLD
    comm = Communicator(world, "world")
    other, first = 1 - world.rank, world.rank == 0
    raw_recv = (lambda buf, src: world.Recv(buf, source=src))
    raw_send = (lambda buf, dst: world.Send(buf, dest=dst))
    rows, figures, rounds = [], {}, 3 if quick else 7
    for nbytes in QUICK_SIZES if quick else SIZES:
        buf = np.zeros(nbytes, dtype=np.uint8)
        n = iterations(nbytes, quick)
        cases = {"raw": pingpong(raw_send, raw_recv, buf, other, n, first),
                 "hpcpar": pingpong(comm.send, comm.recv_, buf, other, n, first)}
        times = slowest_rank(world, interleave(cases, rounds, time.perf_counter, world.Barrier))
        one_way = {k: min(ts) / (2 * n) for k, ts in times.items()}
        bw = {k: nbytes / t for k, t in one_way.items()}
        figures[str(nbytes)] = {"latency_s": one_way, "bandwidth_Bps": bw, "round_trips": n}
        rows.append([size(nbytes), us(one_way["raw"]), us(one_way["hpcpar"]), rate(bw["raw"]), rate(bw["hpcpar"]),
                     ratio(bw["hpcpar"] / bw["raw"])])
    if world.rank:
        return None
    res = Result()
    res.table("Ping-pong between 2 ranks (one-way time, best round of the interleaved rounds)",
              ["message", "latency raw", "latency hpcpar", "bandwidth raw", "bandwidth hpcpar", "hpcpar / raw"], rows,
              ["raw: mpi4py Send/Recv on preallocated numpy buffers; hpcpar: Communicator.send/recv_.",
               "Both ranks share the machine's two cores: bandwidth is a memory copy through MPI's shared "
               "memory, not a network."])
    big = [(int(k), f["bandwidth_Bps"]["hpcpar"] / f["bandwidth_Bps"]["raw"]) for k, f in figures.items()
           if int(k) >= 2 ** 20]
    worst = min(big, key=lambda kv: kv[1])
    res.target("p2p bandwidth through hpcpar.comm at >= 1 MB, worst size", ">= 0.95x raw",
               f"{ratio(worst[1])} (at {size(worst[0])})", worst[1] >= 0.95)
    res.figures = figures
    return res
