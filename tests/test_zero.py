"""ZeRO without MPI: the options' refusals, the memory budget's one-line refusal, the flat buffers and
who owns what in them."""
from types import SimpleNamespace

import numpy as np
import pytest

from hpcpar.data_parallel.flat import FlatBuffer, layout, owners, placeholder
from hpcpar.nn.parameter import Parameter
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
    (dict(dp_shard=2), 4, "needs --zero 1, 2 or 3"),
    (dict(whole_tensors=True), 2, "needs --zero 1, 2 or 3"),
    (dict(dp_shard=3, zero=1), 4, "must divide dp = 4"),
    (dict(dp_shard=1, zero=2), 4, "over dp-shard x cp = 1 rank"),
    (dict(dp_shard=4, zero=3, ep=6, experts=12, batch_size=12), 12, "must divide one another"),
    (dict(dp_shard=3, zero=1, ep=2, experts=8, batch_size=12), 12, "must divide one another"),
    (dict(whole_tensors=True, zero=1, memory_budget=1.0), 2, "give one of them"),
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


def test_whole_tensors_go_longest_first_to_the_least_loaded_rank():
    """LPT: 7 -> rank 0; 5 -> 1; 4 -> 2; 3 -> 2 (4 < 5 < 7); 2 -> 1 (5 < 7 = 7); 2 -> 0 (7 = 7 < 9)."""
    assert owners([2, 7, 3, 5, 4, 2], 3) == [1, 0, 2, 1, 2, 0]
    starts, size = layout([2, 7, 3, 5, 4, 2], 3, whole_tensors=True)
    assert size == 3 * 9                                            # k: the fullest rank's 7 + 2
    assert starts == [9, 0, 18, 9 + 2, 18 + 3, 7]                  # in its owner's range, in their order
    assert layout([2, 7, 3], 2) == ([0, 2, 9], 12)                  # by position: end to end, padded


def test_a_buffer_hands_its_owner_whole_tensors_shaped_as_the_parameters():
    """What a matrix optimizer needs: under whole-tensor ownership the slice a rank updates holds each of
    its parameters whole, and FlatSlice.tensors() gives their data and gradient in their shapes."""
    def params():
        return [Parameter(f"p{i}", np.arange(np.prod(s), dtype=float).reshape(s) + i) for i, s in
                enumerate([(3, 4), (5,), (2, 2), (6, 2)])]
    mine = {}
    for rank in range(2):
        ps = params()
        flat = FlatBuffer(ps, SimpleNamespace(size=2, rank=rank), whole_tensors=True)
        got = flat.slice(0).tensors()
        assert all(flat.owner(p) == rank for p, _, _ in got)
        for p, data, grad in got:
            assert data.shape == grad.shape == p.full_shape
            np.testing.assert_array_equal(data, params()[int(p.name[1:])].data)
        mine[rank] = sorted(p.name for p, _, _ in got)
    assert mine == {0: ["p0", "p1"], 1: ["p2", "p3"]}               # 12 -> 0, 12 -> 1, 5 -> 0, 4 -> 1


class _Request:
    def __init__(self):
        self.done = False

    def test(self):
        return self.done

    def wait(self):
        self.done = True


class _Flat:
    """A buffer whose sum has two phases, each a request the test completes by hand."""

    def __init__(self, name, posted):
        self.name, self.posted = name, posted

    def reduce_inside(self):
        self.inside = _Request()
        return self.inside

    def reduce_across(self):
        self.posted.append(self.name)
        self.across = _Request()
        return self.across


def test_second_phases_are_posted_in_the_order_the_sums_started():
    """HSDP's all-reduce across follows a buffer's reduce-scatter; MPI matches collectives by their
    order, so b's may not start before a's even when b's reduce-scatter finished first."""
    from hpcpar.data_parallel.protocol import Sums
    posted = []
    sums, a, b = Sums(), _Flat("a", posted), _Flat("b", posted)
    sums.start(a)
    sums.start(b)
    b.inside.done = True
    assert sums.poll() == [] and posted == []
    a.inside.done = True
    assert sums.poll() == [] and posted == ["a", "b"]
    b.across.done = True
    assert sums.poll() == [b]                           # done in any order once posted
    assert sums.poll(keep=0) == [a] and a.across.done and not sums.queue
