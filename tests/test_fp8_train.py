"""FP8/FP4 training on one rank: every recipe learns, which layers are quantised, what a user sees
(metrics, warnings, the table), the bf16 rest, the limited accumulator, and the refusals."""
import io
import json

import numpy as np
import pytest

from hpcpar.precision import FP8
from hpcpar.runtime import UsageError
from hpcpar.training.config import TrainConfig, check

FAST = dict(model="tiny", layers=2, hidden=32, heads=2, seq_len=16, batch_size=8, synthetic_vocab=8,
            synthetic_branching=2, synthetic_order=1, warmup=2, lr=3e-2, progress=False)


def trainer(**kw):
    from mpi4py import MPI
    from hpcpar.training.step import Trainer
    return Trainer(TrainConfig(**dict(FAST, **kw)), MPI.COMM_SELF)


@pytest.mark.parametrize("precision", FP8)
def test_every_recipe_trains(precision):
    """12 steps of a 2-block model on a language of 8 tokens, 2 choices each: the mean of the last 4
    losses is 0.48-0.64 of the first (1.91) in every recipe (measured)."""
    t = trainer(precision=precision, steps=12)
    losses = [t.step(s).loss for s in range(12)]
    assert np.mean(losses[-4:]) < 0.75 * losses[0], losses


def test_which_layers_are_quantised():
    """The blocks' linear layers; not the embedding, the head, a mixture of experts (its router
    included), nor under NVFP4 the last 16% of the blocks."""
    t = trainer(precision="fp8-rowwise", model="moe-tiny", hidden=32, heads=2)
    assert sorted(t.low_precision.layers) == [f"h.{i}.attn.{n}" for i in (0, 1) for n in ("c_attn", "c_proj")]
    t = trainer(precision="nvfp4", layers=3)
    assert sorted({name.split(".")[1] for name in t.low_precision.layers}) == ["0", "1"]
    assert t.chunks[0].blocks[2].mlp.c_fc.mm is None


def test_metrics_table_and_summary(tmp_path):
    from mpi4py import MPI
    from hpcpar.training.loop import Loop
    out = io.StringIO()
    cfg = TrainConfig(**dict(FAST, precision="fp8-blockwise", fp8_block=16, steps=2, profile=True,
                             metrics=str(tmp_path / "m.jsonl")))
    Loop(cfg, MPI.COMM_SELF, out=out).run()
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    fp8 = records[-1]["fp8"]
    assert 0.005 < fp8["rel_err"] < 0.1 and fp8["saturated"] == 0
    assert set(fp8["layers"]["h.1.mlp.c_fc"]) == {"forward.x", "forward.w", "input.dy", "input.w",
                                                  "weight.x", "weight.dy"}
    text = out.getvalue()
    assert "fp8-blockwise: GEMM inputs' relative error" in text
    assert "\n  h.0.attn.c_attn        forward  x        e4m3 tile 1x16 " in text
    assert "\n  h.0.attn.c_attn        forward  w        e4m3 block 16x16 " in text


def test_bf16_elsewhere_keeps_fp32_masters():
    t = trainer(precision="mxfp8", fp8_rest="bf16", steps=3)
    losses = [t.step(s).loss for s in range(3)]
    p = t.chunks[0].blocks[0].mlp.c_fc.weight
    assert p.data.dtype.name == "bfloat16" and p.master.dtype == np.float32 and np.all(np.isfinite(losses))


def test_a_narrow_accumulator_changes_the_sums():
    """--fp8-accumulator-bits 8: a coarse running sum, promoted every 16 K-elements - not the fp32 step."""
    exact = trainer(precision="fp8-blockwise", fp8_block=16).step(0).loss
    narrow = trainer(precision="fp8-blockwise", fp8_block=16, fp8_accumulator_bits=8).step(0).loss
    assert narrow != exact and abs(narrow - exact) < 0.05 * exact


@pytest.mark.parametrize("flags, message", [
    (dict(fp8_block=16), "--fp8-block shapes FP8/FP4 training: it needs --precision fp8-tensorwise"),
    (dict(precision="fp8-rowwise", fp8_amax_history=16), "delayed scaling keeps one scale per tensor"),
    (dict(precision="mxfp8", fp8_block=16), "mxfp8's blocks are its format's"),
    (dict(precision="fp8-tensorwise", fp8_param_gather=True), "it needs --zero 3 and --precision fp8-tensorwise"),
    (dict(precision="nvfp4", fp8_rest="bf16", dtype="float64"), "--fp8-rest bf16 keeps float32 master weights"),
    (dict(precision="nvfp4", fp8_rest="bf16", cp=2), "use --precision fp32 or --fp8-rest fp32"),
])
def test_options_refused(flags, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        check(TrainConfig(**dict(FAST, **flags)), 2)


@pytest.mark.parametrize("flags, message", [
    (dict(precision="mxfp8", tp=2), "--precision mxfp8: --tp 2 leaves 16 of the query heads' features on each "
                                    "rank, not a multiple of the 32-wide scaling blocks, which would straddle two "
                                    "ranks (a smaller --tp)"),
    (dict(precision="fp8-blockwise", fp8_block=8, cp=2, documents=True, seq_len=48),
     "--precision fp8-blockwise: --cp 2 gives each rank runs of 6 positions, not a multiple of the 8-token scaling "
     "blocks of the weight gradient, which would straddle two ranks (a longer --seq-len, a smaller --cp, or "
     "--fp8-block)"),
])
def test_a_block_straddling_two_ranks_is_refused_before_any_rank_communicates(flags, message):
    """Refused by model_config, which the Trainer runs before it makes the grid's communicators."""
    from hpcpar.training.models import model_config
    with pytest.raises(UsageError) as refused:
        model_config(check(TrainConfig(**dict(FAST, **flags)), 2))
    assert str(refused.value) == message
