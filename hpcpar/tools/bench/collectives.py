"""(c) All-reduce, all-gather, reduce-scatter and all-to-all through hpcpar.comm against raw mpi4py (2 and 4 ranks).

Each operation at a few payload sizes (the bytes each rank hands to MPI), float32.  "raw" is the
mpi4py buffer call doing the same work as the hpcpar call beside it, so "hpcpar / raw" is what the
wrapper itself costs (counting, timing, checks, the tracer and flight-recorder hooks):

    all_reduce_(x)            in place, as data parallelism's buckets   raw: Allreduce(IN_PLACE, x)
    all_reduce(x, out=y)      into a buffer the caller keeps            raw: Allreduce(x, y)
    all_reduce(x)             into a new array, as tensor parallelism   raw: Allreduce(x, np.empty_like(x))
    all_gather(x, out=y)      into a buffer the caller keeps            raw: Allgather(x, y)
    all_gather(x)             into a new (size * n) array               raw: Allgather(x, np.empty(size * n))
    reduce_scatter(x, out=y)  into a buffer the caller keeps            raw: Reduce_scatter_block(x, y)
    reduce_scatter(x)         into a new (n / size) array               raw: the same into np.empty(n / size)
    all_to_all(x, out=y)      n / size to each rank, into a kept buffer raw: Alltoall(x, y)
    all_to_all(x)             into a new array                          raw: Alltoall(x, np.empty_like(x))
    all_to_allv(x, c, c, out=y)  the counts given, into a kept buffer   raw: Alltoallv with the same counts
    all_to_allv(x, c)         the counts exchanged first, new output    raw: Alltoall of the counts, Alltoallv
                              (the all-to-alls at 4 KB and 32 MB; all_to_allv's raw side reuses its
                              displacements, the wrapper computes them from the counts on every call)

A new output costs both sides the same: at tens of MB, the kernel zeroing its pages on first touch
takes about as long as the copy itself - which is why the calls take ``out=``.
Every call is timed alone after a barrier, raw and hpcpar alternating call by call; the slowest
rank's time counts, and each side keeps its fastest call.  At 2 ranks a ladder times, the same way,
what each piece of the wrapper adds to a 4 KB all-gather (ladder()).  A last table times the
wrapper's Python alone: the same calls on a stand-in for the MPI communicator whose methods return at
once, in loops of many calls, so that hpcpar minus raw is what the wrapper adds, free of MPI's noise.  With 4 ranks on 2 cores the ranks take turns on the cores
(MPI spins while it waits), so those times say more about the scheduler than about MPI.
"""
import time

import numpy as np
from mpi4py import MPI

from hpcpar.comm import flight
from hpcpar import tracer as trace
from hpcpar.tools.bench.common import Result, interleave, ratio, size, slowest_rank, us
from hpcpar.comm import Communicator
from hpcpar.comm.buffers import PLAIN
from hpcpar.comm.stats import Count

SIZES = [4 * 2 ** 10, 256 * 2 ** 10, 4 * 2 ** 20, 32 * 2 ** 20]
QUICK_SIZES = [4 * 2 ** 10, 2 ** 20]


def operations(world, comm, n):
    """name -> (raw call, hpcpar call) on buffers of n float32 numbers per rank."""
    p = world.size
    x, y, y2 = np.ones(n, np.float32), np.ones(n, np.float32), np.ones(n, np.float32)
    gathered, gathered2 = np.empty(n * p, np.float32), np.empty(n * p, np.float32)
    scattered, scattered2 = np.empty(n // p, np.float32), np.empty(n // p, np.float32)
    counts = np.full(p, n // p)                         # all_to_allv's rows per rank: even, for raw's sake
    at = np.cumsum(counts) - counts

    def raw_exchanged():
        got = np.empty(p, counts.dtype)
        world.Alltoall(counts, got)
        world.Alltoallv([x, (counts, at)], [np.empty(int(got.sum()), np.float32), (got, np.cumsum(got) - got)])

    return {
        "all_reduce_ (in place)": (lambda: world.Allreduce(MPI.IN_PLACE, y), lambda: comm.all_reduce_(y2)),
        "all_reduce(out=)": (lambda: world.Allreduce(x, y), lambda: comm.all_reduce(x, out=y2)),
        "all_reduce (new output)": (lambda: world.Allreduce(x, np.empty_like(x)), lambda: comm.all_reduce(x)),
        "all_gather(out=)": (lambda: world.Allgather(x, gathered), lambda: comm.all_gather(x, out=gathered2)),
        "all_gather (new output)": (lambda: world.Allgather(x, np.empty(n * p, np.float32)),
                                    lambda: comm.all_gather(x)),
        "reduce_scatter(out=)": (lambda: world.Reduce_scatter_block(x, scattered),
                                 lambda: comm.reduce_scatter(x, out=scattered2)),
        "reduce_scatter (new output)": (lambda: world.Reduce_scatter_block(x, np.empty(n // p, np.float32)),
                                        lambda: comm.reduce_scatter(x)),
        "all_to_all(out=)": (lambda: world.Alltoall(x, y), lambda: comm.all_to_all(x, out=y2)),
        "all_to_all (new output)": (lambda: world.Alltoall(x, np.empty_like(x)), lambda: comm.all_to_all(x)),
        "all_to_allv(out=), counts given": (lambda: world.Alltoallv([x, (counts, at)], [y, (counts, at)]),
                                            lambda: comm.all_to_allv(x, counts, counts, out=y2)),
        "all_to_allv, counts exchanged": (raw_exchanged, lambda: comm.all_to_allv(x, counts)),
    }


class StandIn:
    """A communicator whose calls return at once: what remains of a call is Python."""

    def __init__(self, size):
        self.rank, self.size = 0, size

    def Allreduce(self, *args):
        pass

    Allgather = Reduce_scatter_block = Alltoall = Alltoallv = Barrier = Allreduce


def python_per_call(p, n, calls=2000, rounds=30):
    """name -> seconds the wrapper adds to one call (hpcpar minus raw, both on the stand-in)."""
    standin = StandIn(p)
    cases = operations(standin, Communicator(standin, "stand-in"), n)
    loops = {f"{op} {side}": (lambda f=f: [f() for _ in range(calls)])
             for op, pair in cases.items() for side, f in zip(("raw", "hpcpar"), pair)}
    best = {k: min(ts) / calls for k, ts in interleave(loops, rounds, time.perf_counter).items()}
    return {op: best[f"{op} hpcpar"] - best[f"{op} raw"] for op in cases}


def ladder(world, n, rounds):
    """What each piece of the wrapper costs, cold (one call after a barrier, as above): an all-gather of
    n float32 numbers per rank into a kept output, with one more of the things hpcpar.comm does around
    the MPI call on each rung - written inline, the cheapest Python can do them.  Returns
    [(rung, fastest seconds of the slowest rank)], raw first and hpcpar.comm last."""
    x, out = np.ones(n, np.float32), np.empty(world.size * n, np.float32)
    comm, count, allgather = Communicator(world, "ladder"), Count(), world.Allgather

    def called(x, out):
        allgather(x, out)
        return out

    def counted(x, out):
        count.calls += 1
        count.bytes += x.nbytes
        allgather(x, out)

    def timed(x, out):
        count.calls += 1
        count.bytes += x.nbytes
        start = time.perf_counter()
        allgather(x, out)
        count.seconds += time.perf_counter() - start

    def checked(x, out):
        if out.size != world.size * x.size or not out.flags.c_contiguous or out.dtype is not x.dtype:
            raise ValueError("out")
        if not x.flags.c_contiguous or type(x) is not np.ndarray or type(out) is not np.ndarray or \
                x.dtype not in PLAIN or trace._active is not None or flight._active is not None:
            raise ValueError("x")
        timed(x, out)

    rungs = {"raw mpi4py: Allgather(x, out)": lambda: allgather(x, out),
             "+ a Python function around it": lambda: called(x, out),
             "+ calls and bytes counted": lambda: counted(x, out),
             "+ the seconds blocked timed": lambda: timed(x, out),
             "+ the checks (out's size, layout, dtype; x's layout; plain numpy; no tracer) and one call more":
                 lambda: checked(x, out),
             "hpcpar.comm: all_gather(x, out=out)": lambda: comm.all_gather(x, out=out)}
    calls = interleave(rungs, rounds, time.perf_counter, world.Barrier)
    return [(rung, min(ts)) for rung, ts in slowest_rank(world, calls).items()]


def run(quick):
    world = MPI.COMM_WORLD
    comm = Communicator(world, "world")
    rows, figures, targets = [], {}, []
    for nbytes in QUICK_SIZES if quick else SIZES:
        n = nbytes // 4
        iters = max(4, min(300, int((0.01 if quick else 0.1) / (5e-6 + 4 * world.size * nbytes / 5e9))))
        for op, (raw, ours) in operations(world, comm, n).items():
            if op.startswith("all_to_all") and nbytes not in (SIZES[0], SIZES[-1]) and not quick:
                continue                # the all-to-alls at the two ends only: the 4-rank run keeps its budget
            # one call per turn, raw and hpcpar alternating, a barrier before each
            calls = interleave({"raw": raw, "hpcpar": ours}, iters, time.perf_counter, world.Barrier)
            fastest = {k: min(ts) for k, ts in slowest_rank(world, calls).items()}
            figures[f"{op} {nbytes}"] = fastest
            rows.append([op, size(nbytes), us(fastest["raw"]), us(fastest["hpcpar"]),
                         ratio(fastest["hpcpar"] / fastest["raw"])])
            # a target at 32 MB only: at 4 KB the wrapper's microsecond is below any step's noise (retired),
            # and the ladder table below says where it goes
            if world.size == 2 and nbytes >= 32 * 2**20 and op.startswith("all_gather"):
                targets.append((f"{op}, {size(nbytes)}, 2 ranks: hpcpar / raw", "<= 1.10x",
                                fastest["hpcpar"] / fastest["raw"], 1.1))
    steps = ladder(world, 1024, 50 if quick else 400) if world.size == 2 else None
    if world.rank:
        return None
    res = Result()
    res.table(f"{world.size} ranks: time of one call (the slowest rank; fastest of the alternating calls)",
              ["operation", "payload per rank", "raw mpi4py", "hpcpar.comm", "hpcpar / raw"], rows,
              ["payload: the bytes each rank hands to MPI (an all-gather's own part, a reduce-scatter's whole "
               "input); raw does the same work (the same output, new or kept), so the ratio is what the wrapper "
               "costs; below 1.00x is noise."]
              + (["4 ranks share 2 cores: oversubscribed, the absolute times are the scheduler's."]
                 if world.size > 2 else []))
    res.figures = figures
    if steps:
        raw = steps[0][1]
        res.table("What each piece of the wrapper costs: a 4 KB all_gather(out=), 2 ranks, timed as above",
                  ["what the call does", "time", "/ raw", "added by this rung"],
                  [[rung, us(t), ratio(t / raw), "" if i == 0 else us(t - steps[i - 1][1])]
                   for i, (rung, t) in enumerate(steps)],
                  ["each rung adds one piece to the rung above, written inline (the cheapest Python can do "
                   "it); the last rung but one is everything hpcpar.comm does on this path, so its ratio is the "
                   "floor of a Python wrapper that keeps these features."])
        res.figures["ladder"] = dict(steps)
    python = python_per_call(world.size, 1024, rounds=5 if quick else 30)
    res.table("The wrapper's Python alone: hpcpar minus raw on a stand-in for MPI (one process, 4 KB arrays)",
              ["operation", "added per call", "share of the raw 4 KB call above"],
              [[op, f"{t * 1e9:.0f} ns", f"{t / figures[f'{op} 4096']['raw']:.0%}" if f"{op} 4096" in figures
                else "-"] for op, t in python.items()],
              ["the fastest of the rounds on each side; loops of 2000 calls, so clock reads do not count."])
    res.figures["python per call"] = python
    for what, goal_text, value, goal in targets:
        res.target(what, goal_text, ratio(value), value <= goal)
    return res
