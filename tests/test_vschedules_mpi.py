"""ZB-V and DualPipeV on real ranks, float64: the loss and every gradient equal the single-rank step
within 1e-10 at pp 2 and 4 (m = p, 2p and one not a multiple of p, where the schedule allows it),
inside 8-rank layouts with TP and DP, and when the schedule comes from a CSV file."""
import pytest

from hpcpar.pipeline import csv_format
from hpcpar.pipeline.schedules import build
from hpcpar.runtime import UsageError
from train_helpers import GPT_DIMS, check_step, config


def sizes(schedule, pp):
    """m = p, 2p and 2p + 1; DualPipeV starts at 2p (its warm-up alone runs 2p forwards)."""
    return [m for m in (pp, 2 * pp, 2 * pp + 1) if schedule != "dualpipev" or m >= 2 * pp]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", ["zb-v", "dualpipev"])
def test_v_schedules_match_one_rank(comm, schedule):
    for pp in (2, 4):
        if comm.size % pp:
            continue
        dp = comm.size // pp
        for m in sizes(schedule, pp):
            check_step(comm, pp=pp, dp=dp, schedule=schedule, chunks=2, microbatches=m,
                       batch_size=2 * dp * m)


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("schedule", ["zb-v", "dualpipev"])
def test_v_schedules_inside_3d_layouts(comm, schedule):
    check_step(comm, tp=2, pp=2, dp=2, schedule=schedule, chunks=2, microbatches=5, batch_size=20)
    check_step(comm, tp=2, pp=4, dp=1, schedule=schedule, chunks=2, microbatches=8, batch_size=16,
               sequence_parallel=True)


@pytest.mark.mpi(min_size=2)
def test_a_schedule_file_trains_exactly(comm, tmp_path):
    # torch's CSV format, as `hpcpar schedule --export` writes it; every rank reads its own copy
    path = tmp_path / "zbv.csv"
    csv_format.write(build("zb-v", 2, 3, 2), path)
    check_step(comm, pp=2, dp=comm.size // 2, schedule_file=str(path), microbatches=3, batch_size=6 * (comm.size // 2))


@pytest.mark.mpi(min_size=2)
def test_too_few_microbatches_refused_in_one_line(comm, tmp_path):
    from hpcpar.training.config import check
    with pytest.raises(UsageError) as err:
        check(config(pp=2, dp=comm.size // 2, schedule="dualpipev", chunks=2, microbatches=2,
                     batch_size=4 * (comm.size // 2)), comm.size)
    assert str(err.value) == ("the dualpipev schedule needs at least 4 micro-batches on 2 stages "
                              "(its warm-up alone runs that many), got 2")
    path = tmp_path / "zbv.csv"
    csv_format.write(build("zb-v", 2, 4, 2), path)
    with pytest.raises(UsageError, match="^schedule file .* is written for 4 micro-batches, the run has 2$"):
        check(config(pp=2, dp=comm.size // 2, schedule_file=str(path), microbatches=2,
                     batch_size=4 * (comm.size // 2)), comm.size)
