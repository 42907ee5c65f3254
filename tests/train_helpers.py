"""Build trainers for layout-equivalence tests: a small float64 model, any layout of a communicator."""
import numpy as np

from hpcpar.training.config import TrainConfig

GPT_DIMS = dict(model="tiny", layers=8, hidden=32, heads=8, seq_len=8, synthetic_vocab=29, batch_size=16)
LLAMA_DIMS = dict(model="llama-tiny", layers=4, hidden=32, heads=4, kv_heads=2, seq_len=8, synthetic_vocab=29,
                  batch_size=16)
MLP_DIMS = dict(model="mlp", layers=8, hidden=16, batch_size=16)


def config(tp=1, pp=1, dp=1, schedule="1f1b", microbatches=0, dims=GPT_DIMS, **kw):
    values = dict(dims, tp=tp, pp=pp, dp=dp, schedule=schedule, microbatches=microbatches or pp,
                  dtype="float64", progress=False, warmup=0, lr=3e-3, seed=7)
    values.update(kw)
    return TrainConfig(**values)


def trainer(comm, **kw):
    from hpcpar.training.step import Trainer
    return Trainer(config(**kw), comm)


def rel_err(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def reference(comm, **kw):
    """The single-rank run of the same configuration, computed on every rank (COMM_SELF)."""
    from mpi4py import MPI
    kw = dict(kw, tp=1, cp=1, pp=1, dp=1, ep=1, microbatches=1, schedule="1f1b", sequence_parallel=False, zero1=False,
              zero=0, fsdp_blocks=1, reshard_after_forward=True, partition="uniform", dp_shard=0, whole_tensors=False)
    kw.pop("chunks", None)
    kw.pop("schedule_file", None)
    return trainer(MPI.COMM_SELF, **kw)


def global_loss(t, losses):
    """The step's mean loss from every rank's per-micro-batch sums, as the trainer computes it."""
    return t.world_totals(losses)[0]


def free(t):
    t.grid.free()


def full_grad(p, comm):
    """A parameter's gradient gathered to its full shape (as the single-rank model has it)."""
    if p.shard is None:
        return p.grad
    return p.shard.assemble(comm.mpi.allgather(p.grad.copy()), p.full_shape)


def check_step(comm, **kw):
    """One step's loss and every gradient of this layout equal the single-rank step within 1e-10."""
    ref = reference(comm, **kw)
    want_loss = global_loss(ref, ref.gradients(0))
    want = {p.name: p.grad for p in ref.parameters()}
    t = trainer(comm, **kw)
    loss = global_loss(t, t.gradients(0))
    what = ", ".join(f"{k}={v}" for k, v in kw.items() if k != "dims")
    assert rel_err(loss, want_loss) <= 1e-10, f"loss differs ({what})"
    for p in t.parameters():
        err = rel_err(full_grad(p, t.ep_comm if p.expert else t.grid.tp_comm), want[p.name])
        assert err <= 1e-10, f"gradient of {p.name} differs by {err:.1e} ({what})"
    free(t)
    free(ref)
