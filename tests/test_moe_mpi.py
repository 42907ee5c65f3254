"""Mixtures of experts on real ranks, float64, dropless: data parallelism, pipelines (with recomputation) give the
single-rank step's loss and every gradient within 1e-10 (routing is per token, so splitting the batch
or the layers changes no token's experts)."""
import pytest

from test_moe_train import MIXTRAL_DIMS, MOE_DIMS
from train_helpers import check_step


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dims", [MOE_DIMS, MIXTRAL_DIMS], ids=["gpt2", "llama"])
def test_data_and_pipeline_parallel_experts_match_one_rank(comm, dims):
    check_step(comm, dp=comm.size, dims=dict(dims, shared_experts=1))
    check_step(comm, pp=2, dp=comm.size // 2, microbatches=2, dims=dims, recompute=True)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dims", [MOE_DIMS, MIXTRAL_DIMS], ids=["gpt2", "llama"])
def test_expert_parallel_matches_one_rank(comm, dims):
    """ep 2 and (at 4 ranks) ep 4: the rows go to the experts' ranks and back by all-to-all."""
    for ep in (2, 4):
        if comm.size % ep == 0:
            check_step(comm, dp=comm.size, ep=ep, dims=dict(dims, experts=4, shared_experts=1))
    if comm.size >= 4:       # with a pipeline and recomputation: the all-to-alls run again in the backward
        check_step(comm, pp=2, dp=comm.size // 2, ep=2, microbatches=2, recompute=True, dims=dims)


@pytest.mark.mpi(min_size=8)
def test_eight_rank_expert_parallel_layouts_match_one_rank(comm):
    if comm.size != 8:
        pytest.skip("layouts of exactly 8 ranks")
    check_step(comm, dp=8, ep=8, dims=dict(MIXTRAL_DIMS, experts=8))
    check_step(comm, pp=2, dp=4, ep=4, microbatches=2, dims=MIXTRAL_DIMS)
