"""(o) How much of data parallelism's gradient all-reduce hides behind the backward pass.

The buckets' ``Iallreduce`` starts during the backward (data_parallel.py), but MPICH moves a
non-blocking collective on only while the rank is inside an MPI call: started and then left alone,
a bucket waits until ``finish()``, and the all-reduce is hardly hidden at all.  Two remedies:

* test calls in the backward: DataParallel.poll (the default) calls MPI_Testall on the buckets in
  flight whenever the backward reports finished gradients;
* MPICH's progress thread, ``MPIR_CVAR_ASYNC_PROGRESS=1`` (the benchmark ``overlap-async`` runs this
  one under it): a thread per rank that keeps calling MPI's progress engine - and takes a core for it.

Measured per round, side by side: the step with polling and without, and the same buckets all-reduced
alone (blocking).  **Exposed** is the time the step still waits in ``finish()``, on the rank that
arrived last (the others wait for it too, which is imbalance, not communication); hidden = 1 - exposed /
all-reduce alone.
"""
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

from hpcpar.bench.common import BENCH_MODEL, Result, interleave, ms, pct, slowest_rank

QUICK_MODEL = dict(hidden=32, layers=2, heads=2, seq_len=16, vocab=64, batch_size=8)


def run(quick):
    from hpcpar.config import TrainConfig
    from hpcpar.train import Trainer
    world = MPI.COMM_WORLD
    dims = QUICK_MODEL if quick else BENCH_MODEL
    cfg = TrainConfig(model="small", untied=True, steps=10 ** 6, progress=False, optimizer="sgd", dp=world.size,
                      **dims)
    t = Trainer(cfg, world)
    counter = iter(range(10 ** 6))
    exposed = {True: [], False: []}

    def step(poll):
        t.dp.poll = poll
        before = t.dp.comm.stats.seconds["wait"]
        t.step(next(counter))
        exposed[poll].append(t.dp.comm.stats.seconds["wait"] - before)

    def all_reduce_alone():
        for b in t.dp.buckets:
            t.dp.comm.all_reduce_(b.grad)
    cases = {"polled": lambda: step(True), "not polled": lambda: step(False), "all-reduce alone": all_reduce_alone}
    times = slowest_rank(world, interleave(cases, 3 if quick else 8, time.perf_counter, world.Barrier))
    waits = {}
    for poll, ts in exposed.items():
        last = np.array(ts[1:])                      # the untimed first call of each case: left out
        world.Allreduce(MPI.IN_PLACE, last, op=MPI.MIN)
        waits[poll] = last
    if world.rank:
        return None
    alone = min(times["all-reduce alone"])
    res = Result()
    rows = []
    for poll, name in ((True, "polled"), (False, "not polled")):
        best, med = min(waits[poll]), statistics.median(waits[poll])
        rows.append([name, ms(min(times[name])), ms(alone), ms(best), ms(med), pct(1 - best / alone),
                     pct(1 - med / alone)])
        res.figures[name] = {"step_s": min(times[name]), "all_reduce_alone_s": alone, "exposed_best_s": best,
                             "exposed_median_s": med, "hidden": 1 - best / alone, "hidden_median": 1 - med / alone}
    progress = os.environ.get("MPIR_CVAR_ASYNC_PROGRESS", "0")
    if world.size == 2:
        res.target(f"dp 2{' with the progress thread' if progress == '1' else ''}: all-reduce hidden (polled, "
                   "median)", ">= 50%", pct(1 - statistics.median(waits[True]) / alone),
                   1 - statistics.median(waits[True]) / alone >= 0.5)
    n = sum(b.grad.nbytes for b in t.dp.buckets)
    res.table(f"dp {world.size}, MPIR_CVAR_ASYNC_PROGRESS={progress}: {len(t.dp.buckets)} buckets, "
              f"{n / 2**20:.1f} MB of gradients (GPT hidden {t.mcfg.d_model}, {t.mcfg.n_layer} layers)",
              ["buckets", "step", "all-reduce alone", "exposed (best)", "exposed (median)", "hidden (best)",
               "hidden (median)"], rows,
              ["exposed: time waiting in finish() on the rank that arrived last; hidden = 1 - exposed / alone.",
               "The last bucket (the embedding's) is launched when the backward ends: it cannot hide."]
              + (["8 ranks share 2 cores: a rank that waits spins on a core another rank needs."]
                 if world.size > 2 else []))
    return res
