"""One transformer block at tp = 1 and tp = 2 on two ranks: time, bytes moved, communication share.

tp = 1: each rank runs the whole block (both cores busy, as with two data-parallel replicas); tp = 2:
the two ranks share it Megatron-style, two all-reduces of B x T x C forward and two backward (with
sequence parallelism: a reduce-scatter and an all-gather in place of each).  The three take turns,
each timed after a barrier on the slowest rank.  The bytes and the time spent in MPI come from the
tensor-parallel communicator's own counters (``comm.stats``: payload handed to MPI, seconds blocked).
"""
import time

import numpy as np
from mpi4py import MPI

from hpcpar.tools.bench.common import Result, interleave, ms, pct, ratio, size, slowest_rank
from hpcpar.comm import Communicator

SHAPES = [(256, 8, 128), (512, 8, 128)]           # hidden, sequences, tokens each
QUICK_SHAPES = [(64, 2, 32)]


def block_step(hidden, batch, seq, comm, sequence_parallel):
    """A function running one forward + backward of block 0 of a GPT stage, at comm.size-way TP."""
    from hpcpar.nn import GPT, Context, GPTConfig
    from hpcpar.tensor_parallel import parallelize
    cfg = GPTConfig(vocab_size=64, seq_len=seq, n_layer=4, n_head=max(2, hidden // 64), d_model=hidden)
    stage = parallelize(GPT(cfg, seed=0, dtype="float32", layers=[0], first=False, last=False), comm,
                        sequence_parallel)
    ctx = Context()
    if sequence_parallel:
        k = seq // comm.size
        ctx.seq_slice, ctx.seq_len = slice(comm.rank * k, (comm.rank + 1) * k), seq
    tokens = seq // comm.size if sequence_parallel else seq
    x = np.random.default_rng(comm.rank).standard_normal((batch, tokens, hidden)).astype(np.float32)

    def step():
        y, caches = stage.forward(x, ctx)
        stage.backward(0.1 * y, caches)
    return step


def run(quick):
    world = MPI.COMM_WORLD
    solo = world.Split(world.rank, 0)                                 # a group of one: tp = 1
    rows, figures, rounds = [], {}, 2 if quick else 6
    for hidden, batch, seq in QUICK_SHAPES if quick else SHAPES:
        # one Communicator (so one set of counters) per layout
        layouts = {"tp 1": (Communicator(solo, "tp"), False), "tp 2": (Communicator(world, "tp"), False),
                   "tp 2 + sequence parallel": (Communicator(world, "tp"), True)}
        blocked = {name: [] for name in layouts}
        cases = {}
        for name, (comm, sp) in layouts.items():
            step = block_step(hidden, batch, seq, comm, sp)

            def case(step=step, comm=comm, out=blocked[name]):
                before = comm.stats.total_seconds()
                step()
                out.append(comm.stats.total_seconds() - before)
            cases[name] = case
        times = slowest_rank(world, interleave(cases, rounds, time.perf_counter, world.Barrier))
        calls = 1 + rounds                               # interleave's untimed first call, then the rounds
        base = min(times["tp 1"])
        for name, (comm, sp) in layouts.items():
            best = min(times[name])
            i = times[name].index(best)
            share = blocked[name][1 + i] / best            # MPI time in that same round (rank 0)
            nbytes = comm.stats.total_bytes() / calls if comm.size > 1 else 0
            figures[f"{name} hidden {hidden}"] = {"step_s": best, "speedup": base / best, "comm_share": share,
                                                  "payload_bytes": nbytes}
            rows.append([str(hidden), name, ms(best), ratio(base / best), pct(share) if comm.size > 1 else "-",
                         size(nbytes) if nbytes else "-"])
    solo.Free()
    if world.rank:
        return None
    res = Result()
    res.table("One block, forward + backward, 8 sequences of 128 tokens (wall time of the slowest rank, "
              "best of the interleaved rounds)",
              ["hidden", "layout", "block step", "speed-up over tp 1", "time blocked in MPI", "payload per rank"],
              rows, ["payload: bytes this rank handed to MPI per block step (comm.stats); a ring all-reduce "
                     "puts 2 (n-1)/n of that on the wire per rank, i.e. the same for n = 2.",
                     "time blocked in MPI: comm.stats.seconds during the best round, as a share of it."])
    res.figures = figures
    return res
