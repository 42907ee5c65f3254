"""What the watchdog costs a training step (docs/reliability.md, "When a job hangs"). Target: <= 1%.

Eight ranks run the benchmark GPT as tp 2 x pp 2 x dp 2 (1F1B, 4 micro-batches) with the watchdog
started as ``hpcpar train`` starts it; round after round, one step runs with the flight recorder
installed (every communication call and pipeline action entered in the ring buffer, the heartbeat
kept) and one without, in alternating order (common.interleave; the slowest rank's wall time per
step).  The watchdog thread runs throughout: it wakes twice a second for a few microseconds, too
little to tell apart in a step.

A second, steadier figure: the recorder's own cost per operation, timed in a tight loop on rank 0,
times the operations one step records, as a share of the step.
"""
import time

from mpi4py import MPI

from hpcpar.tools.bench.common import BENCH_MODEL, Result, interleave, ms, paired_ratio, slowest_rank, summary

QUICK_MODEL = dict(hidden=32, layers=4, heads=2, seq_len=16, vocab=64, batch_size=8)


def recorder_cost(n=20_000, repeats=5):
    """Seconds per recorded operation (begin + end) and per pipeline action (``at``): the best of
    ``repeats`` loops of ``n`` calls on one rank, the least disturbed by the machine's other jobs."""
    from hpcpar.comm.flight import FlightRecorder
    rec = FlightRecorder(rank=0)

    def op():
        rec.end(rec.begin("all_reduce", "tp", None, 1024, blocking=True))

    def action():
        rec.at("F", 0)

    best = {}
    for name, fn in (("op", op), ("action", action)):
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best.get(name, 1.0), (time.perf_counter() - start) / n)
    return best["op"], best["action"]


def run(quick):
    from hpcpar.comm import flight
    from hpcpar.watch import watchdog
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.observers import STOP_SIGNALS
    from hpcpar.training.step import Trainer
    world = MPI.COMM_WORLD
    dims = QUICK_MODEL if quick else BENCH_MODEL
    cfg = TrainConfig(model="small", untied=True, steps=10 ** 6, progress=False, tp=2, pp=2, dp=2,
                      microbatches=4, grad_clip=0.0, hang_timeout=300.0, **dims)
    trainer = Trainer(cfg, world)
    dog = watchdog.start(cfg, trainer.grid, STOP_SIGNALS)
    rec, steps = dog.recorder, iter(range(10 ** 6))

    def recorded():
        flight.install(rec)
        trainer.step(next(steps))

    def bare():
        flight.uninstall()
        trainer.step(next(steps))

    before = rec.count
    recorded()
    ops_per_step = rec.count - before
    rounds = 3 if quick else 12
    times = slowest_rank(world, interleave({"recorded": recorded, "bare": bare}, rounds,
                                           clock=time.perf_counter, before=world.Barrier))
    dog.stop()
    per_op, per_action = recorder_cost(2_000 if quick else 20_000)
    actions = len(trainer.engine.program)
    if world.rank:
        return None
    res = Result()
    fig = summary(times, "recorded", "bare")
    step = fig["theirs_s"]
    direct = (ops_per_step * per_op + actions * per_action) / step
    fig.update(ops_per_step=ops_per_step, actions_per_step=actions, seconds_per_op=per_op,
               seconds_per_action=per_action, recorder_share_of_step=direct,
               overhead_paired=paired_ratio(times["recorded"], times["bare"]) - 1)
    res.figures["watchdog"] = fig
    res.table(f"tp 2 x pp 2 x dp 2, 1F1B with 4 micro-batches, hidden {dims['hidden']}, {dims['layers']} layers, "
              f"seq {dims['seq_len']}, batch {dims['batch_size']}: one step with and without the flight recorder",
              ["", "with the recorder", "without", "overhead"],
              [["step time (best of rounds, slowest rank)", ms(fig["ours_s"]), ms(fig["theirs_s"]),
                f"{100 * (fig['ratio'] - 1):+.2f}%"],
               ["median of the per-round ratios", "", "", f"{100 * fig['overhead_paired']:+.2f}%"],
               ["recorder cost x operations per step (rank 0)",
                f"{ops_per_step} ops x {per_op * 1e6:.2f} us + {actions} actions x {per_action * 1e6:.2f} us",
                "", f"{100 * direct:.3f}%"]],
              [f"{rounds} rounds, alternating order; the watchdog thread runs in both columns.",
               "The last row is the steadier figure: the two step times differ by less than the machine's noise."])
    res.target("watchdog and flight recorder, share of a 2x2x2 step", "<= 1%", f"{100 * direct:.3f}%",
               direct <= 0.01)
    return res
