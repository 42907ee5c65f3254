"""Pipeline parallelism on real ranks: every schedule, pp = 2 and 4, GPT and deep MLP, float64:
the loss and every gradient equal the single-rank step within 1e-10."""
import pytest

from train_helpers import GPT_DIMS, MLP_DIMS, check_step

CASES = [("gpipe", {}), ("1f1b", {}), ("zb-h1", {}), ("interleaved", {"chunks": 2})]


def layouts(world):
    return [pp for pp in (2, 4) if world.size % pp == 0]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule, extra", CASES)
@pytest.mark.parametrize("dims", [GPT_DIMS, MLP_DIMS], ids=["gpt", "mlp"])
def test_every_schedule_matches_one_rank(comm, schedule, extra, dims):
    for pp in layouts(comm):
        for m in (pp, 2 * pp, 3):          # m = 3 is not a multiple of p
            dp = comm.size // pp
            check_step(comm, pp=pp, dp=dp, schedule=schedule, microbatches=m, dims=dims,
                       batch_size=2 * dp * m, **extra)


@pytest.mark.mpi(min_size=2)
def test_zb_h2_matches_one_rank(comm):
    # m = p cuts the warm-up of 2(p - 1 - r) forwards short (at pp 4), 2p + 1 runs it whole and is
    # no multiple of p
    for pp in layouts(comm):
        for m in (pp, 2 * pp + 1):
            dp = comm.size // pp
            check_step(comm, pp=pp, dp=dp, schedule="zb-h2", microbatches=m, batch_size=dp * m)


@pytest.mark.mpi(min_size=2)
def test_uneven_partition_and_recompute(comm):
    check_step(comm, pp=2, dp=comm.size // 2, partition="5,3", recompute=True, microbatches=4)
    check_step(comm, pp=2, dp=comm.size // 2, partition="params", schedule="gpipe", microbatches=2)


@pytest.mark.mpi(min_size=2)
def test_one_rank_holding_both_ends_of_an_interleaved_model(comm):
    """pp = 1 with 2 chunks: the tied embedding is one parameter used by both chunks, and its DP
    all-reduce must wait for the second use (small buckets make an early start visible)."""
    check_step(comm, pp=1, dp=comm.size, schedule="interleaved", chunks=2, microbatches=2, bucket_mb=0.001,
               batch_size=2 * comm.size * 2)
