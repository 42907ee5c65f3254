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
