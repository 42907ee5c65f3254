"""Shared by the tensor-parallel tests: build serial and parallel copies of a model and compare."""
from hpcpar.comm import Communicator
from hpcpar.nn import Context
from train_helpers import rel_err


def tp_comm(world, tp):
    """Split the world into groups of tp consecutive ranks (the grid's TP groups)."""
    return Communicator(world.Split(world.rank // tp, world.rank), "tp")


def seq_context(comm, T, sequence_parallel, **kw):
    if not sequence_parallel:
        return Context(**kw)
    k = T // comm.size
    return Context(seq_slice=slice(comm.rank * k, (comm.rank + 1) * k), seq_len=T, **kw)


def full_grad(p, comm):
    """A parameter's gradient gathered to its full shape (as the single-rank model has it)."""
    if p.shard is None:
        return p.grad
    return p.shard.assemble(comm.mpi.allgather(p.grad.copy()), p.full_shape)


def assert_close(got, want, what, rtol=1e-10):
    err = rel_err(got, want)
    assert err <= rtol, f"{what}: relative error {err:.2e} > {rtol:.0e}"
