"""(o) How much of data parallelism's gradient all-reduce hides behind the backward pass, and why.

The buckets' ``Iallreduce`` starts during the backward (data_parallel/replicas.py), but MPICH moves a
non-blocking collective on only while the rank is inside an MPI call, and one all-reduce needs several
such calls - one per round of its algorithm, 5 or 6 for a 4 MB bucket at two ranks.  Started and left
alone, a bucket waits until ``finish()``.  The remedies, measured side by side (``DataParallel.poll``):

* "gemms" (the default): MPI_Testall on the buckets in flight between the backward's GEMMs
  (hpcpar/inflight.py) and whenever it reports finished gradients - a few milliseconds apart;
* "reports": only when it reports gradients - once a layer, tens of milliseconds apart;
* "off": never;
* MPICH's progress thread, ``MPIR_CVAR_ASYNC_PROGRESS=1`` (the benchmark ``overlap-async`` runs this
  one under it): a thread per rank that keeps calling MPI's progress engine - and takes a core for it;
* an algorithm with fewer rounds, ``MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM=sched_recursive_doubling``
  (the benchmark ``overlap-rd``): 3 or 4 calls per all-reduce at two ranks instead of 5 or 6, but
  log2(dp) whole-bucket exchanges where the default moves 2 (dp - 1) / dp buckets' worth.

Measured per round: the step in each mode and the same buckets all-reduced alone (blocking).
**Exposed** is the time the step still waits in ``finish()``, on the rank that arrived last (the others
wait for it too, which is imbalance, not communication); hidden = 1 - exposed / all-reduce alone.

Where the exposed time comes from, in the default mode: per bucket, its size, how long before the end
of the backward it was launched, and in how many steps it was still in flight when ``finish()`` began.
A bucket launched at the end - the input embedding's, whose gradient the backward finishes last -
cannot hide; every other one can, given enough polls.
"""
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

from hpcpar.tools.bench.common import BENCH_MODEL, Result, interleave, ms, pct, slowest_rank

QUICK_MODEL = dict(hidden=32, layers=2, heads=2, seq_len=16, vocab=64, batch_size=8)
MODES = {"gemms": "polled between GEMMs", "reports": "polled at reports only", "off": "not polled"}


def run(quick):
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    world = MPI.COMM_WORLD
    dims = QUICK_MODEL if quick else BENCH_MODEL
    cfg = TrainConfig(model="small", untied=True, steps=10 ** 6, progress=False, optimizer="sgd", dp=world.size,
                      **dims)
    t = Trainer(cfg, world)
    counter = iter(range(10 ** 6))
    exposed = {mode: [] for mode in MODES}
    launched_before_end, in_flight = [], []       # per step of the default mode: one entry per bucket
    finish = t.dp.finish

    def finish_observed(late=()):
        """finish(), noting first when each bucket was launched and whether it is still in flight."""
        now = time.perf_counter()
        if t.dp.poll == "gemms":
            launched_before_end.append([now - x for x in t.dp.launch_times])
            in_flight.append([not r.mpi_request.Get_status() for r in t.dp.sums.requests()])
        finish(late)
    t.dp.finish = finish_observed

    def step(mode):
        t.dp.poll = mode
        before = t.dp.comm.stats.seconds["wait"]
        t.step(next(counter))
        exposed[mode].append(t.dp.comm.stats.seconds["wait"] - before)

    def all_reduce_alone():
        for b in t.dp.flats:
            t.dp.comm.all_reduce_(b.grad)
    cases = {name: (lambda mode=mode: step(mode)) for mode, name in MODES.items()}
    cases["all-reduce alone"] = all_reduce_alone
    times = slowest_rank(world, interleave(cases, 3 if quick else 8, time.perf_counter, world.Barrier))
    waits = {}
    for mode, ts in exposed.items():
        last = np.array(ts[1:])                      # the untimed first call of each case: left out
        world.Allreduce(MPI.IN_PLACE, last, op=MPI.MIN)
        waits[mode] = last
    if world.rank:
        return None
    alone = min(times["all-reduce alone"])
    res = Result()
    rows = []
    for mode, name in MODES.items():
        best, med = min(waits[mode]), statistics.median(waits[mode])
        rows.append([name, ms(min(times[name])), ms(alone), ms(best), ms(med), pct(1 - best / alone),
                     pct(1 - med / alone)])
        res.figures[name] = {"step_s": min(times[name]), "all_reduce_alone_s": alone, "exposed_best_s": best,
                             "exposed_median_s": med, "hidden": 1 - best / alone, "hidden_median": 1 - med / alone}
    progress = os.environ.get("MPIR_CVAR_ASYNC_PROGRESS", "0")
    algorithm = os.environ.get("MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM", "auto")
    hidden = 1 - statistics.median(waits["gemms"]) / alone
    if world.size == 2:
        setting = " with the progress thread" if progress == "1" else \
            f" with Iallreduce {algorithm}" if algorithm != "auto" else ""
        res.target(f"dp 2{setting}: all-reduce hidden (polled, median)", ">= 50%", pct(hidden), hidden >= 0.5)
    n = sum(b.grad.nbytes for b in t.dp.flats)
    res.table(f"dp {world.size}, MPIR_CVAR_ASYNC_PROGRESS={progress}, MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM="
              f"{algorithm}: {len(t.dp.flats)} buckets, "
              f"{n / 2**20:.1f} MB of gradients (GPT hidden {t.mcfg.d_model}, {t.mcfg.n_layer} layers)",
              ["buckets", "step", "all-reduce alone", "exposed (best)", "exposed (median)", "hidden (best)",
               "hidden (median)"], rows,
              ["exposed: time waiting in finish() on the rank that arrived last; hidden = 1 - exposed / alone."]
              + (["8 ranks share 2 cores: a rank that waits spins on a core another rank needs."]
                 if world.size > 2 else []))
    before_end = np.median(np.array(launched_before_end), axis=0)
    share = np.mean(np.array(in_flight), axis=0)
    res.table(f"dp {world.size}, polled between GEMMs: where the exposed time comes from (rank 0, "
              f"{len(in_flight)} steps)",
              ["bucket", "size", "launched before finish() (median)", "still in flight at finish()"],
              [[i, f"{b.grad.nbytes / 2**20:.2f} MB", ms(x), pct(s)]
               for i, (b, x, s) in enumerate(zip(t.dp.flats, before_end, share))],
              ["Buckets in backward order, cut where the backward reports gradients (Stage.grad_groups). "
               "The last ones - the first block's and the input embedding's - are launched as the backward "
               "ends: they cannot hide."])
    res.figures["in_flight_at_finish"] = [float(s) for s in share]
    return res
