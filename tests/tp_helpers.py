"""Shared by the tensor-parallel tests: build serial and parallel copies of a model and compare."""
from hpcpar.comm import Communicator
from hpcpar.nn import Context
from train_helpers import full_grad, rel_err  # noqa: F401 (full_grad: for the tensor-parallel tests)


def tp_comm(world, tp):
    """Split the world into groups of tp consecutive ranks (the grid's TP groups)."""
    return Communicator(world.Split(world.rank // tp, world.rank), "tp")


def seq_context(comm, T, sequence_parallel, **kw):
    if not sequence_parallel:
        return Context(**kw)
    k = T // comm.size
    return Context(seq_slice=slice(comm.rank * k, (comm.rank + 1) * k), seq_len=T, **kw)


def assert_close(got, want, what, rtol=1e-10):
    err = rel_err(got, want)
    assert err <= rtol, f"{what}: relative error {err:.2e} > {rtol:.0e}"
