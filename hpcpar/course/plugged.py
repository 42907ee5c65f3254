"""Exercises plugged into the trainer: the student's functions run inside the real training step.

``hpcpar train --plug FILE`` (training/plug.py) puts a file's functions - a tensor-parallel layer pair,
a 1F1B order, ZeRO-1's shard, ring attention's forward, the experts' all-to-alls - in place of the
engine's own.  ``check_in_trainer`` is the last stage of those exercises' checks, on every rank of a
4-rank job: rank 0 trains the model alone (the package's code, before anything is plugged), then every
layout of the exercise trains it on a group of the job's ranks with the student's functions in place,
and each step's loss and gradient norm must be one rank's, in float64, to 1e-9.  A group smaller than
the job leaves the other ranks waiting (on_ranks.groups), so one job runs, say, tp 2 and tp 4.
"""
import numpy as np

from hpcpar.course.on_ranks import groups, stage
from hpcpar.course.wrong import Wrong

STEPS = 3
GPT = dict(model="tiny", layers=4, hidden=32, heads=4, seq_len=16, synthetic_vocab=32, batch_size=12)
MOE = dict(GPT, model="moe-tiny", layers=2)
RUN = dict(dtype="float64", warmup=0, lr=3e-3, seed=7, progress=False, steps=STEPS)
RTOL = 1e-9


def _train(options, comm):
    """(loss, gradient norm) of each step of ``options`` on the mpi4py communicator ``comm``."""
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    trainer = Trainer(TrainConfig(**options), comm)
    return [(r.loss, r.grad_norm) for r in (trainer.step(s) for s in range(STEPS))]


def _layout(options):
    """'tp 2 x dp 2' - the options of a layout that are not the model's."""
    return " x ".join(f"{k} {v}" for k, v in options.items() if k in ("tp", "cp", "pp", "dp", "ep", "zero")) or "one rank"


def _compare(got, want, layout):
    for step, ((loss, norm), (loss1, norm1)) in enumerate(zip(got, want), 1):
        if not np.isfinite(loss) or abs(loss - loss1) > RTOL * abs(loss1):
            raise Wrong(f"in the trainer at {layout}: step {step}'s loss is {loss:.12g}, one rank's is {loss1:.12g}"
                        + (" (the forward: the first step's loss depends on nothing else)" if step == 1 else ""))
        if not np.isfinite(norm) or abs(norm - norm1) > RTOL * abs(norm1):
            raise Wrong(f"in the trainer at {layout}: step {step}'s gradient norm is {norm:.12g}, one rank's is "
                        f"{norm1:.12g} - the loss is right, so look at the backward")


def check_in_trainer(module, world, model, layouts):
    """Train ``model`` (GPT or MOE) at each of ``layouts`` (TrainConfig options, their world size
    tp x cp x pp x dp) with ``module``'s functions plugged in; compare with one rank's run."""
    from mpi4py import MPI

    from hpcpar.training.plug import plugged
    options = dict(model, **RUN)
    want = _train(options, MPI.COMM_SELF) if world.rank == 0 else None
    want = world.mpi.bcast(want, root=0)
    for layout in layouts:
        n = layout.get("tp", 1) * layout.get("cp", 1) * layout.get("pp", 1) * layout.get("dp", 1)
        (_, comm), = groups(world, (n,))

        def run():
            if comm is not None:
                with plugged(module):
                    _compare(_train(dict(options, **layout), comm.mpi), want, _layout(layout))
        stage(world, run)
