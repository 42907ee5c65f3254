"""FP8/FP4 recipes in every kind of layout: with --dtype float64 (the GEMM inputs quantised, float64
everywhere else) the losses of two steps (the second, under delayed scaling, from the first one's
amax) equal one rank's to 1e-10.

One rank runs the same micro-batches: a data-parallel replica's micro-batch is a tensor of its own
(its scales are its own, as on a GPU), so the reference takes dp x microbatches of them; tensor and
context parallelism cut one tensor over ranks, and its scales come from the maximum over exactly
those ranks (training/low_precision.py).  Several layouts share each launched job; tiny models."""
import pytest
from mpi4py import MPI

from train_helpers import free, rel_err, trainer

GPT = dict(model="tiny", layers=2, hidden=64, heads=4, seq_len=64, synthetic_vocab=29, batch_size=4)
LONG = dict(GPT, seq_len=128, batch_size=2)                 # cp 2: runs of 32 positions, MX's block
LLAMA = dict(model="llama-tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, seq_len=32, synthetic_vocab=29,
             batch_size=4)
MOE = dict(model="moe-tiny", layers=2, hidden=64, heads=4, seq_len=32, synthetic_vocab=29, batch_size=8)
BLOCK16 = dict(fp8_block=16)

LAYOUTS = {
    2: [("tp2", "fp8-tensorwise", GPT, dict(tp=2)),
        ("cp2", "mxfp8", LONG, dict(cp=2)),
        ("pp2", "fp8-blockwise", GPT, dict(pp=2, microbatches=2, **BLOCK16)),
        ("dp2.zero3", "nvfp4", GPT, dict(dp=2, zero=3)),
        ("tp2.sp", "fp8-rowwise", LLAMA, dict(tp=2, sequence_parallel=True))],
    4: [("tp2.cp2", "fp8-blockwise", GPT, dict(tp=2, cp=2, **BLOCK16)),
        ("tp2.pp2.zb", "mxfp8", GPT, dict(tp=2, pp=2, microbatches=2, schedule="zb-h1")),
        ("dp4.ep2", "fp8-rowwise", MOE, dict(dp=4, ep=2)),
        ("tp2.dp2.delayed", "fp8-tensorwise", LLAMA, dict(tp=2, dp=2, fp8_amax_history=4)),
        ("cp2.ulysses.dp2.zero3", "nvfp4", LLAMA, dict(cp=2, cp_kind="ulysses", dp=2, zero=3, seq_len=64))],
    8: [("tp2.pp2.dp2.zero1", "fp8-rowwise", GPT, dict(tp=2, pp=2, dp=2, microbatches=2, zero1=True)),
        ("tp2.cp2.dp2.zero3", "mxfp8", LONG, dict(tp=2, cp=2, dp=2, zero=3)),
        ("pp2.interleaved.dp4", "nvfp4", LLAMA, dict(pp=2, dp=4, schedule="interleaved", microbatches=2, chunks=2,
                                                      layers=4, batch_size=8))],
}


def one_rank(precision, dims, layout):
    """The single-rank run of the same micro-batches."""
    lay = dict(layout)
    micro = lay.get("dp", 1) * (lay.get("microbatches") or lay.get("pp", 1))
    keep = {k: lay[k] for k in ("fp8_block", "fp8_amax_history", "layers", "seq_len", "batch_size") if k in lay}
    return trainer(MPI.COMM_SELF, dims=dims, precision=precision, microbatches=micro, **keep)


def losses(t, steps=2):
    out = [t.step(s).loss for s in range(steps)]
    free(t)
    return out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_every_layout_equals_one_rank(comm, world):
    if comm.size != world:
        pytest.skip(f"the {world}-rank layouts run at world size {world}")
    for name, precision, dims, layout in LAYOUTS[world]:
        got = losses(trainer(comm, dims=dims, precision=precision, **layout))
        want = losses(one_rank(precision, dims, layout))
        assert rel_err(got, want) <= 1e-10, (name, precision, got, want)


@pytest.mark.mpi(min_size=2)
def test_scales_from_this_rank_alone_would_differ(comm):
    """The test above can fail: a row-parallel layer whose amax is not reduced over tp quantises
    with other scales, and the losses move far beyond 1e-10."""
    if comm.size != 2:
        pytest.skip("2 ranks")
    t = trainer(comm, dims=GPT, precision="fp8-tensorwise", tp=2)
    for q in t.low_precision.layers.values():
        q.groups = {}
    got = losses(t)
    want = losses(one_rank("fp8-tensorwise", GPT, dict(tp=2)))
    assert rel_err(got, want) > 1e-8


@pytest.mark.mpi(min_size=2)
def test_fp8_param_gather_sends_a_byte_a_number_and_changes_nothing_else(comm):
    """ZeRO-3 with --fp8-param-gather: the same losses, bit for bit (each slice quantised with the
    whole weight's scale is what the GEMM would have quantised), fewer all-gather bytes - the
    quantised weights one byte a number instead of bf16's two; and the engine's formula and the planner
    agree on the memory (zero_memory.gathered_number_bytes, one owner), and on what the FP8 gather
    saves, with what the engine's arrays hold (the table's working set is a bound: 2 units)."""
    if comm.size != 2:
        pytest.skip("2 ranks")
    from hpcpar.data_parallel.zero_memory import TERMS, formula, held
    from hpcpar.tools.plan.measured import planner_view
    from hpcpar.tools.plan.memory import stage_memory
    runs = {}
    for gather in (False, True):
        t = trainer(comm, dims=GPT, precision="fp8-tensorwise", dp=2, zero=3, dtype="float32", fp8_rest="bf16",
                    fp8_param_gather=gather)
        runs[gather] = [t.step(s).loss for s in range(2)], t.grid.dp_comm.stats.bytes["all_gather"]
        free(t)
    assert runs[True][0] == runs[False][0]
    quantised = 2 * 12 * 64 * 64                            # GPT's block: 12 h^2 in its four matrices
    assert runs[False][1] - runs[True][1] >= quantised / 2 * 1    # at least one gather of each, a byte saved
    assert runs[True][1] < 0.6 * runs[False][1]
    saved = {}
    for gather in (False, True):        # the working set a step adds: engine, formula, planner
        t = trainer(comm, dims=GPT, precision="fp8-tensorwise", dp=2, zero=3, dtype="float32",
                    fp8_param_gather=gather)
        t.step(0)
        job, layout = planner_view(t.cfg, t.mcfg)
        planned, predicted = stage_memory(job, layout, 0, 1), formula(t.cfg, t.mcfg)
        assert all(planned[k] == predicted[k] for k in TERMS)
        saved[gather] = held(t)["ZeRO working set"], predicted["ZeRO working set"]
        free(t)
    engine, table = (saved[False][i] - saved[True][i] for i in (0, 1))
    assert abs(table / engine - 1) <= 0.1, (engine, table)      # measured 0.925
