"""ZeRO-3's gather/free timeline of one step, as rank 0 sees it (docs/zero.md).

    .venv/bin/mpiexec -n 2 .venv/bin/python -m hpcpar.examples.zero_timeline [--keep]

A 2-block GPT (untied) at dp 2 with --zero 3: four units (embedding, block 0, block 1, head), each
rank holding half of each.  The example records what the step does to each unit, in order:

    post gather    the non-blocking all-gather starts (for the next module: a prefetch)
    wait           the module that needs it blocks until it has arrived
    free           the gathered values are dropped
    grad           its full gradient buffer is allocated (the backward starts)
    reduce         its gradients are final: the non-blocking reduce-scatter of the full gradient into
                   this rank's slice starts (the full buffer is freed once it has completed)

``--keep`` runs with --no-reshard-after-forward: the units stay gathered from their forward to their
backward (fewer gathers, more memory).  Then the bytes a rank holds between steps.
"""
import sys

from hpcpar.examples._common import once, require_size


def main():
    from mpi4py import MPI

    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    from hpcpar.data_parallel.zero_memory import held
    world = MPI.COMM_WORLD
    require_size(world, 2, "zero_timeline")
    keep = "--keep" in sys.argv[1:]
    cfg = TrainConfig(layers=2, hidden=32, heads=2, seq_len=16, batch_size=4, untied=True, dp=2, zero=3,
                      reshard_after_forward=not keep, progress=False, dtype="float64")
    t = Trainer(cfg, world)
    fsdp = t.dp
    names = {}                          # unit -> the module it serves, as printed
    for chunk in t.chunks:
        labels = (["embedding"] if chunk.embed else []) + [f"block {i}" for i in range(len(chunk.blocks))] + \
            (["head"] if chunk.head else [])
        for m, label in zip(chunk.modules(), labels):
            for u in fsdp._module_units[id(m)]:
                names.setdefault(id(u), label)
    events = []

    def record(u, what, method, when=lambda u: True):
        def wrapped(*args):
            if when(u):
                events.append(f"{what:12s} {names[id(u)]}")
            return method(*args)
        return wrapped
    for u in fsdp.flats:
        u.start_gather = record(u, "post gather", u.start_gather)
        u.finish_gather = record(u, "wait", u.finish_gather, lambda u: u.gathering is not None)
        u.free = record(u, "free", u.free)
        u.new_grad = record(u, "grad", u.new_grad)
    launch = fsdp._launch
    fsdp._launch = lambda i: (events.append(f"{'reduce':12s} {names[id(fsdp.flats[i])]}")
                              if not fsdp._launched[i] else None, launch(i))
    t.step(0)
    mode = "kept from forward to backward" if keep else "resharded after forward"
    once(world, f"one step at dp 2, --zero 3, {mode}: {len(fsdp.flats)} units, {fsdp.gathers} all-gathers")
    for e in events:
        once(world, "  " + e)
    kib = {k: f"{v / 1024:.1f} KiB" for k, v in held(t).items()}
    once(world, "held by rank 0 between steps: weights {weights}, gradients {gradients}, "
                "optimizer {optimizer state}".format(**kib))
    t.grid.free()


if __name__ == "__main__":
    from hpcpar.runtime import run_guarded
    sys.exit(run_guarded(main))
