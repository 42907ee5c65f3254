"""Checkpoints across ZeRO stages on real ranks (float64): a ZeRO-3 checkpoint resumes in a ZeRO 0, 1, 2
layout and the other way round with the same numbers, and the consolidated weights are identical."""
import numpy as np
import pytest

from hpcpar.checkpoint import load_checkpoint, save_checkpoint
from hpcpar.checkpoint.consolidated import gather_full
from train_helpers import free, rel_err, trainer


@pytest.fixture
def shared_dir(comm, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("zckpt")) if comm.rank == 0 else None
    return comm.bcast(path, root=0)


def run(t, steps):
    return [t.step(s).loss for s in steps]


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("source, target", [(3, 0), (3, 2), (1, 3), (0, 3)], ids=lambda z: f"zero{z}")
def test_any_zero_stage_resumes_any_other(comm, shared_dir, source, target):
    if comm.size not in (4, 8):
        pytest.skip("layouts of 4 or 8 ranks")
    layout = dict(pp=2, dp=comm.size // 2, microbatches=2)
    straight = trainer(comm, zero=source, **layout)
    want = run(straight, range(3))
    free(straight)
    first = trainer(comm, zero=source, **layout)
    run(first, range(2))
    save_checkpoint(first, shared_dir, 2)
    exported = gather_full(first)
    free(first)
    second = trainer(comm, zero=target, dp=comm.size, microbatches=1)        # another layout, too
    assert load_checkpoint(second, shared_dir) == 2
    again = gather_full(second)
    if comm.rank == 0:                  # the consolidated weights: the same numbers, bit for bit
        assert sorted(again) == sorted(exported)
        for name, w in exported.items():
            np.testing.assert_array_equal(again[name], w)
    got = run(second, range(2, 3))
    assert rel_err(got, want[2:]) <= 1e-10, (got, want[2:])
    free(second)
