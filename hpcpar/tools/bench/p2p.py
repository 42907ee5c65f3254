"""(b) Point-to-point latency and bandwidth, OSU style: hpcpar.comm against raw mpi4py, 8 B to 64 MB.

A ping-pong between ranks 0 and 1 (the OSU micro-benchmarks' latency test): rank 0 sends a message
and waits for it to come back; one-way time = round trip / 2, bandwidth = message size / one-way
time.  "raw" is mpi4py's buffer-based ``Send``/``Recv`` on preallocated numpy arrays, the floor of
what Python can do with this MPI; "hpcpar" is ``Communicator.send``/``recv_``, which adds the
contiguity check, the counters and the device-buffer test.

OSU averages over a loop of round trips.  On this shared machine a rank loses its core now and then
for milliseconds, so every round trip is timed alone, raw and hpcpar alternate round trip by round
trip (both see the same machine), and the table keeps each one's fastest round trip (the average
would measure the other jobs).  Target: hpcpar >= 0.95x raw bandwidth at 1 MB and above.
"""
import time

import numpy as np
from mpi4py import MPI

from hpcpar.tools.bench.common import Result, interleave, ratio, rate, size, us
from hpcpar.comm import Communicator

SIZES = [8 * 8 ** i for i in range(7)] + [4 * 2 ** 20, 16 * 2 ** 20, 64 * 2 ** 20]   # 8 B, 64 B, ..., 2 MB, 64 MB
QUICK_SIZES = [8, 4096, 2 ** 20]


def iterations(nbytes, quick):
    """Round trips each side makes: many for tiny messages, few for big ones (about 0.2 s each side)."""
    budget = 0.01 if quick else 0.2
    return int(max(4, min(400, budget / (5e-6 + 2 * nbytes / 5e9))))


def pingpong(send, recv, buf, other, first):
    """One round trip: rank 0 sends and waits for the message to come back; rank 1 echoes it."""
    def run():
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
    rows, figures = [], {}
    for nbytes in QUICK_SIZES if quick else SIZES:
        buf = np.zeros(nbytes, dtype=np.uint8)
        n = iterations(nbytes, quick)
        cases = {"raw": pingpong(raw_send, raw_recv, buf, other, first),
                 "hpcpar": pingpong(comm.send, comm.recv_, buf, other, first)}
        trips = interleave(cases, n, time.perf_counter, world.Barrier)    # rank 0's clock: whole round trips
        one_way = {k: min(ts) / 2 for k, ts in trips.items()}
        bw = {k: nbytes / t for k, t in one_way.items()}
        figures[str(nbytes)] = {"latency_s": one_way, "bandwidth_Bps": bw, "round_trips": n}
        rows.append([size(nbytes), us(one_way["raw"]), us(one_way["hpcpar"]), rate(bw["raw"]), rate(bw["hpcpar"]),
                     ratio(bw["hpcpar"] / bw["raw"])])
    if world.rank:
        return None
    res = Result()
    res.table("Ping-pong between 2 ranks (one-way time = fastest round trip / 2; raw and hpcpar alternate "
              "round trip by round trip)",
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
