"""ZeRO without MPI: the options' refusals, the memory budget's one-line refusal, the units."""
import numpy as np
import pytest

from hpcpar.data_parallel.flat import placeholder
from hpcpar.training.config import TrainConfig, check
from hpcpar.runtime import UsageError
from mpitools import hpcpar, run


@pytest.mark.parametrize("options, world, message", [
    (dict(zero=3), 1, "nothing to shard"),
    (dict(zero=2, tp=2), 2, "nothing to shard"),
    (dict(zero=3, zero1=True), 2, "contradicts --zero 3"),
    (dict(zero=4), 2, "must be 0, 1, 2 or 3"),
    (dict(fsdp_blocks=2), 2, "need --zero 3"),
    (dict(reshard_after_forward=False, zero=1), 2, "need --zero 3"),
    (dict(memory_budget=1.0, model="mlp"), 1, "needs a GPT model"),
])
def test_bad_zero_options_are_refused(options, world, message):
    with pytest.raises(UsageError, match=message):
        check(TrainConfig(**options), world)


def test_zero1_is_stage_one_and_zero_three_over_cp_alone_is_allowed():
    assert check(TrainConfig(zero1=True), 2).zero == 1
    assert check(TrainConfig(zero=3, cp=2, seq_len=16), 2).zero == 3       # dp 1 x cp 2: two ranks share


def test_one_rank_over_the_budget_is_refused_in_one_line():
    """The small model's state in fp32 is ~64 MB on one rank (weights, gradients, AdamW's two moments):
    refused before anything is allocated; tests/test_zero_mpi.py trains it on 8 ranks with ZeRO-3."""
    proc, _ = run(hpcpar() + ["train", "--model", "small", "--steps", "1", "--memory-budget", "0.03",
                              "--no-progress"], timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--memory-budget 0.03 GB" in lines[0] and "ZeRO 0" in lines[0], proc.stderr


def test_a_freed_parameter_holds_no_memory_and_refuses_writes():
    p = placeholder(np.ones((3, 4)))
    assert p.shape == (3, 4) and p.base.nbytes == 8
    with pytest.raises(ValueError):
        p += 1
