"""The schedule owns placement: under schedules (test-only) whose placement puts the last virtual stage on
pipeline rank 0, the inputs, the targets, the loss and the tied-embedding group follow the schedule, and
the step is exact (float64: loss and every gradient within 1e-10 of one rank)."""
from dataclasses import fields

import pytest

from hpcpar.training.config import TrainConfig
from hpcpar.pipeline.schedules import KINDS, Action, Kind, _gpipe
from train_helpers import check_step, free, trainer


def v_order(rank, p, m, v):
    """Every forward of chunk 0, then of chunk 1, then the backwards in reverse: no rank waits on itself."""
    return ([Action("F", mb, c) for c in range(v) for mb in range(m)]
            + [Action("B", mb, c) for c in reversed(range(v)) for mb in range(m)])


def v_placement(rank, chunk, p):
    """A V: rank r holds stages r (going down) and 2p-1-r (coming back), so rank 0 holds both ends."""
    return rank if chunk == 0 else 2 * p - 1 - rank


def reversed_placement(rank, chunk, p):
    """One chunk per rank, the pipeline run backwards: stage 0 on the last rank, the loss on rank 0."""
    return p - 1 - rank


TEST_KINDS = {"v-test": Kind(v_order, chunked=True, placement=v_placement),
              "reversed-test": Kind(_gpipe, all_forwards_first=True, placement=reversed_placement)}


@pytest.fixture
def test_schedules(monkeypatch):
    """The test schedules in KINDS and among --schedule's choices, for the length of one test."""
    choices = next(f for f in fields(TrainConfig) if f.name == "schedule").metadata["choices"]
    for name, kind in TEST_KINDS.items():
        monkeypatch.setitem(KINDS, name, kind)
    choices += list(TEST_KINDS)
    yield
    del choices[-len(TEST_KINDS):]


def ends_of(comm, **kw):
    """(reads inputs, computes the loss, embed group's world ranks or None, micro-batch 0's inputs and
    targets are present) on this rank."""
    t = trainer(comm, **kw)
    inputs, targets, _ = t._contexts_and_batches(0)
    group = t.embed_comm.mpi.allgather(comm.rank) if t.embed_comm else None
    out = (t.reads_inputs, t.computes_loss, group, inputs[0] is not None, targets[0] is not None, t.grid)
    return t, out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("untied", [False, True])
def test_last_stage_on_rank_zero_trains_exactly(comm, test_schedules, untied):
    dp = comm.size // 2
    for schedule in TEST_KINDS:
        kw = dict(pp=2, dp=dp, schedule=schedule, microbatches=2, batch_size=4 * dp, untied=untied)
        check_step(comm, **kw)
        t, (reads, loss, group, has_x, has_y, g) = ends_of(comm, **kw)
        first = 0 if schedule == "v-test" else 1           # the pp rank holding virtual stage 0
        assert (reads, has_x) == (g.pp_rank == first, g.pp_rank == first)
        assert (loss, has_y) == (g.pp_rank == 0, g.pp_rank == 0)
        if schedule == "v-test" or untied:
            assert group is None        # the V ties its two ends on rank 0; an untied head has nothing to sum
        else:                           # the embed group: the rank of stage 0, then the rank of the last stage
            assert group == [g.rank(g.coords, pp=1), g.rank(g.coords, pp=0)]
        free(t)


def test_the_schedule_says_which_ranks_hold_the_ends():
    """Schedule.holders reads the placement backwards; ends() are the ranks of stage 0 and S-1 (pure)."""
    from hpcpar.pipeline.schedules import Schedule, build, validate
    assert build("1f1b", 4, 4).ends() == (0, 3)
    assert build("interleaved", 4, 4, 2).holders()[5] == (1, 1)           # chunk 1 of rank 1: stage 1*4 + 1
    v = Schedule("v-test", 2, 3, 2, False, False, [v_order(r, 2, 3, 2) for r in range(2)], v_placement)
    validate(v)
    assert v.holders() == {0: (0, 0), 1: (1, 0), 2: (1, 1), 3: (0, 1)} and v.ends() == (0, 0)
