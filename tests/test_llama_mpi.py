"""Llama blocks on real ranks, float64: tensor parallelism (4 query heads and 2 K/V heads cut in two),
with and without sequence parallelism, and 8-rank layouts with pipelines - one step's loss and every
gradient equal the single-rank step within 1e-10, and three AdamW steps give its losses."""
import pytest

from train_helpers import LLAMA_DIMS, check_step, free, reference, rel_err, trainer

STEPS = 3


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_tensor_parallel_llama_matches_one_rank(comm, sp):
    # full recomputation with sequence parallelism, the selective one without
    check_step(comm, tp=2, dp=comm.size // 2, sequence_parallel=sp, recompute=sp, recompute_attention=not sp,
               dims=LLAMA_DIMS)


LAYOUTS = {
    "tp2pp2dp2": dict(tp=2, pp=2, dp=2, microbatches=4),
    "tp2pp2dp2-sp-zbh1": dict(tp=2, pp=2, dp=2, schedule="zb-h1", microbatches=2, sequence_parallel=True),
    "pp2dp4-interleaved": dict(pp=2, dp=4, schedule="interleaved", chunks=2, microbatches=2),
}


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_eight_rank_layouts_match_one_rank(comm, name):
    if comm.size != 8:
        pytest.skip("layouts of exactly 8 ranks")
    kw = dict(LAYOUTS[name], dims=LLAMA_DIMS)
    check_step(comm, **kw)
    if name == "tp2pp2dp2":                    # and the optimizer steps that follow
        ref, t = reference(comm, **kw), trainer(comm, **kw)
        want = [ref.step(s).loss for s in range(STEPS)]
        got = [t.step(s).loss for s in range(STEPS)]
        assert rel_err(got, want) <= 1e-10, f"losses {got} vs one rank {want}"
        free(t)
        free(ref)
