"""DeepSeek-V3 blocks with multi-token prediction on real ranks, float64: every layout gives the single-rank
step's loss, MTP loss and every gradient within 1e-10 - MLA's heads over TP (with and without sequence
parallelism), ring and Ulysses CP (the shifted targets found across the shard boundary), PP under each kind
of schedule with the MTP modules on the last stage (their embedding's gradient summed with the first
stage's), EP, DP, recomputation and ZeRO.  Several layouts per launched job, a 2-layer model (one dense
layer, one with experts) and one MTP module, so that the whole file costs a few seconds per world size."""
import pytest

from test_zero_mpi import one_step
from train_helpers import free, reference, rel_err, trainer

# one dense layer then one with experts (4 in 2 groups, a token's 2 from its best group, a shared one);
# MLA with both latents; one MTP module (its block has experts too)
DEEPSEEK_DIMS = dict(model="deepseek-tiny", layers=2, hidden=32, heads=4, ffn=16, seq_len=8, synthetic_vocab=29,
                     batch_size=8, mtp=1, mtp_lambda=0.5)


def check_step(comm, **kw):
    """One AdamW step of this layout: its loss, MTP loss, gradient norm, every gradient and every weight after
    it are the single rank's (ZeRO's shards gathered, TP's and EP's assembled: test_zero_mpi.one_step)."""
    ref = reference(comm, **kw)
    want, want_mtp = one_step(ref), ref.mtp_loss
    free(ref)
    t = trainer(comm, **kw)
    got, got_mtp = one_step(t), t.mtp_loss
    free(t)
    what = ", ".join(f"{k}={v}" for k, v in kw.items() if k != "dims")
    assert want_mtp > 0 and rel_err(got_mtp, want_mtp) <= 1e-10, f"MTP loss {got_mtp} vs {want_mtp} ({what})"
    assert rel_err(got[0], want[0]) <= 1e-10 and rel_err(got[2], want[2]) <= 1e-10, f"loss or norm ({what})"
    for kind, i in (("gradient", 1), ("weight", 3)):
        for name, value in got[i].items():
            assert rel_err(value, want[i][name]) <= 1e-10, f"{kind} of {name} differs ({what})"


@pytest.mark.mpi(min_size=2)
def test_two_rank_layouts_match_one_rank(comm):
    if comm.size != 2:
        pytest.skip("layouts of exactly 2 ranks")
    d = DEEPSEEK_DIMS
    check_step(comm, tp=2, sequence_parallel=True, recompute=True, dims=d)    # MLA over TP, SP, MTP blocks cut
    check_step(comm, cp=2, dims=d)                                             # ring: shifted targets cross shards
    check_step(comm, cp=2, cp_kind="ulysses", ep=2, recompute_attention=True, dims=d)
    check_step(comm, pp=2, microbatches=2, schedule="zb-h1", dims=d)           # MTP on the last stage
    check_step(comm, pp=2, microbatches=4, schedule="dualpipev", dims=dict(d, layers=4))   # both ends on a rank
    check_step(comm, dp=2, ep=2, zero=3, dims=d)


@pytest.mark.mpi(min_size=4)
def test_four_rank_layouts_match_one_rank(comm):
    if comm.size != 4:
        pytest.skip("layouts of exactly 4 ranks")
    d = DEEPSEEK_DIMS
    check_step(comm, tp=2, pp=2, microbatches=2, dims=d)
    check_step(comm, pp=2, cp=2, microbatches=2, schedule="gpipe", zero=1, dims=d)
    check_step(comm, pp=2, dp=2, microbatches=4, schedule="zb-h2", recompute=True, dims=d)
    check_step(comm, pp=2, dp=2, ep=2, microbatches=2, zero=3, dims=d)   # the embedding's copy a unit of its own
    check_step(comm, pp=2, dp=2, chunks=2, schedule="interleaved", microbatches=2, dims=dict(d, layers=4))


@pytest.mark.mpi(min_size=8)
def test_eight_rank_layouts_match_one_rank(comm):
    if comm.size != 8:
        pytest.skip("layouts of exactly 8 ranks")
    d = DEEPSEEK_DIMS
    check_step(comm, tp=2, pp=2, dp=2, ep=2, microbatches=2, dims=d)
    check_step(comm, tp=2, cp=2, dp=2, ep=2, sequence_parallel=True, zero=2, dims=d)
    check_step(comm, cp=2, pp=2, dp=2, schedule="zb-v", chunks=2, microbatches=4, cp_kind="ulysses",
               dims=dict(d, layers=4))


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("layout", [dict(tp=2, pp=2, dp=2, ep=2), dict(tp=2, cp=2, dp=2)], ids=["tp2-pp2-ep2", "tp2-cp2-dp2"])
def test_hugging_face_deepseek_gives_transformers_losses_on_eight_ranks(comm, tmp_path_factory, layout):
    """A DeepseekV3ForCausalLM with an MTP module written by transformers' MtpModel (tests/test_deepseek_hf.py),
    loaded on 8 ranks: transformers' loss and MTP loss within 1e-10."""
    import numpy as np
    from hf_helpers import hf_deepseek, hf_loss, save_hf, transformers
    from hpcpar.checkpoint.consolidated import init_from
    from pathlib import Path
    from test_deepseek_hf import DIMS, transformers_mtp_loss, with_mtp
    if comm.size != 8:
        pytest.skip("layouts of exactly 8 ranks")
    transformers()                                   # every rank skips together, or none does
    path = comm.bcast(str(tmp_path_factory.mktemp("deepseek")) if comm.rank == 0 else None, root=0)
    tokens = np.random.default_rng(5).integers(0, DIMS["vocab_size"], size=(4, 13))
    x, y = tokens[:, :-1], tokens[:, 1:]
    want = None
    if comm.rank == 0:
        model = hf_deepseek({**DIMS, "num_mtp_layers": 1}, seed=4)
        save_hf(model, Path(path, "hf"))
        want = hf_loss(model, x, y), transformers_mtp_loss(model, with_mtp(model, Path(path, "hf"), 1), x, y, 0.3)
    want = comm.bcast(want, root=0)
    t = trainer(comm, **layout, microbatches=2, init_from=f"{path}/hf", layers=0, hidden=0, heads=0, seq_len=12,
                batch_size=4, dims=dict(DEEPSEEK_DIMS, model="", ffn=0, mtp=0, mtp_lambda=0.3))
    init_from(t, f"{path}/hf")
    t.data.batch = lambda step, ids: (x[list(ids)], y[list(ids)])
    result = t.step(0)
    assert t.mcfg.mtp_depth == 1 and result.loss == pytest.approx(want[0], rel=1e-10)
    assert t.mtp_loss == pytest.approx(want[1], rel=1e-10)
    free(t)
