"""3D parallelism at world size 8: every layout and every schedule it admits trains the same model
to the same numbers as one rank (3 AdamW steps, float64)."""
import numpy as np
import pytest

from hpcpar.training.config import check
from hpcpar.runtime import UsageError
from hpcpar.training.models import model_config
from train_helpers import config, free, reference, rel_err, trainer

LAYOUTS = [(1, 1, 8), (2, 2, 2), (2, 4, 1), (4, 2, 1), (1, 8, 1), (8, 1, 1), (2, 1, 4), (1, 2, 4)]
SCHEDULES = [("gpipe", {}), ("1f1b", {}), ("zb-h1", {}), ("interleaved", {"chunks": 2})]
STEPS = 3


def admitted(**kw):
    """Does the layout accept this configuration? (the same checks `hpcpar train` makes)"""
    try:
        model_config(check(config(**kw), 8))
        return True
    except UsageError:
        return False


def losses(t, steps=STEPS):
    return [t.step(s)[0] for s in range(steps)]


@pytest.fixture(scope="module")
def single_rank(comm):
    t = reference(comm)
    out = losses(t)
    free(t)
    return out


def check_layout(comm, single_rank, layout, every_combination):
    """Train with the layout under each schedule it admits, with and without sequence parallelism."""
    if comm.size != 8:
        pytest.skip("layouts of exactly 8 ranks")
    tp, pp, dp = layout
    ran = 0
    # make test: with one stage the schedules differ only in when W runs (the pipeline layouts cover
    # that), and sequence parallelism changes the TP collectives, not the schedule, so it runs once.
    for schedule, extra in SCHEDULES if pp > 1 or every_combination else SCHEDULES[:1]:
        m = max(1, min(2 * pp, 16 // dp))
        kw = dict(tp=tp, pp=pp, dp=dp, schedule=schedule, microbatches=m, **extra)
        with_sp = tp > 1 and (ran == 0 or every_combination)
        for v in [kw] + ([dict(kw, sequence_parallel=True)] if with_sp else []):
            if not admitted(**v):
                continue
            t = trainer(comm, **v)
            got = losses(t)
            free(t)
            err = rel_err(got, single_rank)
            assert err <= 1e-9, f"{v}: losses {got} vs single rank {single_rank} (relative {err:.1e})"
            ran += 1
    assert ran >= 1


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: "tp{}pp{}dp{}".format(*l))
def test_layout_matches_single_rank(comm, single_rank, layout):
    check_layout(comm, single_rank, layout, every_combination=False)


@pytest.mark.slow
@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: "tp{}pp{}dp{}".format(*l))
def test_layout_matches_single_rank_in_every_combination(comm, single_rank, layout):
    check_layout(comm, single_rank, layout, every_combination=True)


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("layout", [(1, 1, 8), (2, 2, 2), (1, 2, 4)], ids=lambda l: "tp{}pp{}dp{}".format(*l))
def test_zero1_equals_plain_data_parallel(comm, layout):
    if comm.size != 8:
        pytest.skip("layouts of exactly 8 ranks")
    tp, pp, dp = layout
    plain, zero = trainer(comm, tp=tp, pp=pp, dp=dp), trainer(comm, tp=tp, pp=pp, dp=dp, zero1=True)
    a, b = losses(plain), losses(zero)
    assert rel_err(b, a) <= 1e-12
    for p, q in zip(plain.parameters(), zero.parameters()):
        assert rel_err(q.data, p.data) <= 1e-12, p.name
    free(plain)
    free(zero)


@pytest.mark.mpi(min_size=2)
def test_bucket_all_reduces_start_before_the_backward_ends(comm):
    """Overlap: with small buckets, the first DP all-reduce is launched while backward still runs."""
    t = trainer(comm, dp=comm.size, microbatches=2, bucket_mb=0.002)
    t.gradients(0)
    backward_end = t.engine.started + max(end for _, end, op, _, _ in t.engine.timeline if op == "B")
    assert len(t.dp.flats) > 3
    assert t.dp.launch_times[0] < backward_end
    assert sum(1 for x in t.dp.launch_times if x < backward_end) >= len(t.dp.flats) - 1
    free(t)


@pytest.mark.mpi(min_size=2)
def test_global_batch_is_split_not_repeated(comm):
    """DP ranks see disjoint samples whose union is the single rank's batch."""
    t = trainer(comm, dp=comm.size, microbatches=1)
    _, _, contexts = t._contexts_and_batches(0)
    mine = [s for c in contexts for s in c.sample_ids]
    everyone = comm.allgather(mine)
    assert sorted(s for ids in everyone for s in ids) == list(range(t.cfg.batch_size))
    np.testing.assert_equal(len(set(mine)), len(mine))
    free(t)
