"""Build trainers for layout-equivalence tests: a small float64 model, any layout of a communicator."""
import numpy as np

from hpcpar.config import TrainConfig

GPT_DIMS = dict(model="tiny", layers=8, hidden=32, heads=8, seq_len=8, synthetic_vocab=29, batch_size=16)
MLP_DIMS = dict(model="mlp", layers=8, hidden=16, batch_size=16)


def config(tp=1, pp=1, dp=1, schedule="1f1b", microbatches=0, dims=GPT_DIMS, **kw):
    values = dict(dims, tp=tp, pp=pp, dp=dp, schedule=schedule, microbatches=microbatches or pp,
                  dtype="float64", progress=False, warmup=0, lr=3e-3, seed=7)
    values.update(kw)
    return TrainConfig(**values)


def trainer(comm, **kw):
    from hpcpar.train import Trainer
    return Trainer(config(**kw), comm)


def rel_err(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def reference(comm, **kw):
    """The single-rank run of the same configuration, computed on every rank (COMM_SELF)."""
    from mpi4py import MPI
    kw = dict(kw, tp=1, pp=1, dp=1, microbatches=1, schedule="1f1b", sequence_parallel=False, zero1=False,
              partition="uniform")
    kw.pop("chunks", None)
    return trainer(MPI.COMM_SELF, **kw)


def global_loss(t, losses):
    """The step's mean loss from every rank's per-micro-batch sums, as the trainer computes it."""
    return t.world_totals(losses)[0]


def free(t):
    t.grid.free()
