"""One calibration probe: a few training steps of the engine itself, taken apart into its pieces.

    python -m hpcpar.tools.plan.probe '{"dtype": "float32", "layers": 2, "hidden": 128, ...}'
    mpiexec -n 2 python -m hpcpar.tools.plan.probe '{... "tp": 2}'

runs ``hpcpar.training.step.Trainer`` (the code ``hpcpar train`` runs) with those options on the synthetic
language and prints one JSON line (rank 0) with, for the fastest of the steps after the first:

    F, B       seconds of computation in one forward / backward action (one micro-batch through the
               stage): the action's time in the engine's timeline less the collectives inside it
               (hpcpar.tracer spans), i.e. the tensor-parallel all-reduces
    rest       the step less its actions: DP wait, gradient norm, optimizer, zeroing, data
    comm       seconds, calls and payload bytes of the TP group's collectives in the step
    cpu        process CPU time / wall time of that step, the lowest of the ranks: below 1 when another
               job took a core

Why whole steps and a fresh process per probe, rather than a TransformerBlock timed in a loop: numpy
allocates every activation and temporary anew, and unless glibc is told to keep freed memory
(hpcpar does: runtime.keep_freed_memory) it serves large ones with fresh pages from the kernel, so a
step can pay a page fault (about 1.5 us per 4 KiB here) for most bytes it allocates.  A block repeated in a loop reuses warm
memory and runs 20-45 % faster than the same block inside a step; the allocator's state also depends
on the largest array the process freed so far, so probes must not share a process.
"""
import json
import sys
import time


def measure(options, steps=4):
    """Run ``steps`` training steps with ``options`` (TrainConfig fields); the figures above."""
    from mpi4py import MPI

    from hpcpar import tracer as trace
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    comm = MPI.COMM_WORLD
    cfg = TrainConfig(model="tiny", progress=False, steps=steps, warmup=1, **options)
    trainer = Trainer(cfg, comm)
    tracer = trace.start("probe")
    tp = trainer.grid.tp_comm
    best = None
    for step in range(steps):
        tracer.events.clear()
        tp.stats.reset()
        comm.Barrier()
        cpu, wall = time.process_time(), time.perf_counter()
        trainer.step(step)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if step == 0:
            continue                          # the first step pays for start-up
        figures = _take_apart(trainer.engine, tracer.events, wall)
        stats = tp.stats
        figures["cpu"] = comm.allreduce(cpu / wall, op=MPI.MIN)
        figures["comm"] = {"seconds": stats.total_seconds(), "calls": stats.calls["all_reduce"],
                           "bytes": stats.bytes["all_reduce"]}
        if best is None or wall < best["step"]:
            best = figures
    trace.stop()
    best["params"] = sum(p.data.size for p in trainer.parameters())
    trainer.grid.free()
    return best if comm.rank == 0 else None


def _take_apart(engine, events, wall):
    """Compute seconds per F and per B action, and the step's time outside the actions."""
    spans = [(start, end) for _, cat, _, start, end, _ in events if cat == "collective"]
    totals, counts, inside = {"F": 0.0, "B": 0.0}, {"F": 0, "B": 0}, 0.0
    for start, end, op, _, _ in engine.timeline:
        inside += end - start
        if op in totals:
            a, b = engine.started + start, engine.started + end
            comm = sum(min(b, e) - max(a, s) for s, e in spans if s < b and e > a)
            totals[op] += end - start - comm
            counts[op] += 1
    return {"F": totals["F"] / counts["F"], "B": totals["B"] / counts["B"], "m": counts["F"],
            "rest": wall - inside, "step": wall}


if __name__ == "__main__":
    result = measure(json.loads(sys.argv[1]))
    if result is not None:
        print(json.dumps(result))
