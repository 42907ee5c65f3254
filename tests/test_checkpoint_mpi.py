"""Checkpoints on real ranks: bit-identical resume, and resharding between layouts (float64)."""
import numpy as np
import pytest

from hpcpar.checkpoint import load_checkpoint, save_checkpoint
from train_helpers import free, rel_err, trainer


@pytest.fixture
def shared_dir(comm, tmp_path_factory):
    """One directory every rank sees (rank 0 makes it)."""
    path = str(tmp_path_factory.mktemp("ckpt")) if comm.rank == 0 else None
    return comm.bcast(path, root=0)


def run(t, steps):
    return [t.step(s).loss for s in steps]


def weights(t):
    """Collective: {name: this rank's master values} (ZeRO-3 gathers them)."""
    return {name: w.copy() for name, w in t.dp.gathered("data").items()}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_resume_is_bit_identical(comm, shared_dir, zero):
    if zero >= 2 and comm.size < 4:
        pytest.skip("ZeRO-2 and 3 need dp x cp > 1")
    layout = dict(pp=2, dp=comm.size // 2, zero=zero, microbatches=2)
    straight = trainer(comm, **layout)
    want = run(straight, range(4))
    first = trainer(comm, **layout)
    run(first, range(2))
    save_checkpoint(first, shared_dir, 2)
    free(first)
    second = trainer(comm, **layout)
    assert load_checkpoint(second, shared_dir) == 2
    got = run(second, range(2, 4))
    assert got == want[2:]                                   # bit for bit
    mine = weights(second)
    for name, w in weights(straight).items():
        np.testing.assert_array_equal(mine[name], w)
    free(straight)
    free(second)


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("target", [(2, 1, 4), (1, 1, 1), (1, 2, 4)], ids=lambda t: "tp{}pp{}dp{}".format(*t))
def test_resharding_continues_with_the_same_numbers(comm, shared_dir, target):
    if comm.size != 8:
        pytest.skip("saves from an 8-rank 2x2x2 layout")
    source = dict(tp=2, pp=2, dp=2, sequence_parallel=True, zero1=True)
    straight = trainer(comm, **source)
    want = run(straight, range(4))
    free(straight)
    first = trainer(comm, **source)
    run(first, range(2))
    save_checkpoint(first, shared_dir, 2)
    free(first)
    tp, pp, dp = target
    if tp * pp * dp == 1:                       # one rank alone: every rank runs it on COMM_SELF
        from mpi4py import MPI
        world = MPI.COMM_SELF
    else:
        world = comm
    second = trainer(world, tp=tp, pp=pp, dp=dp, microbatches=2 if pp > 1 else 1)
    assert load_checkpoint(second, shared_dir) == 2
    got = run(second, range(2, 4))
    assert rel_err(got, want[2:]) <= 1e-9, (got, want[2:])
    free(second)
