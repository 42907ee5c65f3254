"""Documents (--documents: block-diagonal causal masks, positions restarting, boundary targets out of the
loss) and sliding windows on real ranks, float64: every axis - tp/sp, every pipeline schedule, dp with
ZeRO 0-3, ep, recomputation, ring and Ulysses context parallelism at cp 2, 4 and 8 - gives the one-rank
step's loss and every gradient within 1e-10; three AdamW steps the one-rank losses (the tokens each
step counts change with its documents).  Several layouts per launched job, tiny models.

The trl probe (huggingface/trl#6843): perturb one token of a document, and no logit of another
document moves - bit for bit - at ring cp 2 and 4 and Ulysses cp 2 (1 rank: test_documents_model.py)."""
import numpy as np
import pytest

from hpcpar.pipeline.schedules import KINDS
from test_deepseek_mpi import DEEPSEEK_DIMS
from test_moe_train import MIXTRAL_DIMS
from train_helpers import GPT_DIMS, LLAMA_DIMS, check_step, free, reference, rel_err, trainer

DOCS = dict(documents=True, synthetic_doc_len=5)
GPT = dict(GPT_DIMS, seq_len=16, layers=4, **DOCS)
# a Llama whose every other layer has a window of 6 (gpt-oss's pattern), on top of the documents
LLAMA = dict(LLAMA_DIMS, seq_len=16, **DOCS, window=6, window_layers="::2")
MOE = dict(MIXTRAL_DIMS, seq_len=16, **DOCS, window=4)
# latent attention with an MTP module: its shifted targets stop at each document's end, across cp shards
DEEPSEEK = dict(DEEPSEEK_DIMS, seq_len=16, **DOCS)
SCHEDULES = [dict(schedule=name, **({"chunks": 2} if kind.chunked else {})) for name, kind in KINDS.items()]

# (dims, layout) checked at each world size: one step's loss and gradients
LAYOUTS = {
    2: [(GPT, dict(cp=2)), (LLAMA, dict(cp=2)), (LLAMA, dict(cp=2, cp_kind="ulysses")),
        (GPT, dict(tp=2, sequence_parallel=True)), (LLAMA, dict(dp=2, zero=3)),
        (MOE, dict(dp=2, ep=2)), (DEEPSEEK, dict(cp=2))] + [(GPT, dict(pp=2, microbatches=4, **s)) for s in SCHEDULES],
    4: [(GPT, dict(cp=4)), (LLAMA, dict(cp=4)), (LLAMA, dict(tp=2, cp=2, sequence_parallel=True)),
        (GPT, dict(cp=2, pp=2, schedule="interleaved", chunks=2, microbatches=2, recompute=True)),
        (LLAMA, dict(cp=2, dp=2, cp_kind="ulysses", zero=2, recompute_attention=True)),
        (GPT, dict(cp=2, dp=2, zero=1, boundary_targets=True)), (MOE, dict(cp=2, dp=2, ep=4)),
        (DEEPSEEK, dict(pp=2, cp=2, microbatches=2))],
    8: [(GPT, dict(tp=2, cp=2, pp=2, microbatches=2)), (LLAMA, dict(cp=4, dp=2, zero=3)),
        (LLAMA, dict(cp=8)), (GPT, dict(tp=2, cp=2, dp=2, cp_kind="ulysses")),
        (dict(MOE, kv_heads=2), dict(tp=2, pp=2, dp=2, ep=2, microbatches=2))],
}


def check_steps(comm, dims, **layout):
    """Three AdamW steps' losses equal one rank's; each step's loss divides by the targets its own
    documents keep.  (Under ZeRO a rank holds a part of the gradients: the steps check them all.)"""
    ref, t = reference(comm, dims=dims, **layout), trainer(comm, dims=dims, **layout)
    want, got = [ref.step(s).loss for s in range(3)], [t.step(s).loss for s in range(3)]
    assert len({ref.batch_terms(s) for s in range(3)}) > 1 or layout.get("boundary_targets")
    free(t)
    free(ref)
    assert rel_err(got, want) <= 1e-10, f"{layout}: losses {got} vs one rank {want}"


@pytest.mark.mpi(min_size=2)
def test_documents_on_every_axis_match_one_rank(comm):
    if comm.size not in LAYOUTS:
        pytest.skip("layouts of 2, 4 or 8 ranks")
    for dims, layout in LAYOUTS[comm.size]:
        (check_steps if layout.get("zero") else check_step)(comm, dims=dims, **layout)


@pytest.mark.mpi(min_size=2)
def test_bf16_over_documents_matches_one_rank(comm):
    """Mixed precision: a quarter of bf16's epsilon, as the other layouts in low precision
    (test_precision_mpi.py)."""
    if comm.size != 2:
        pytest.skip("tp 2 on 2 ranks")
    kw = dict(tp=2, sequence_parallel=True, dtype="float32", precision="bf16")
    ref, t = reference(comm, dims=GPT, **kw), trainer(comm, dims=GPT, **kw)
    want, got = [ref.step(s).loss for s in range(3)], [t.step(s).loss for s in range(3)]
    free(t)
    free(ref)
    assert rel_err(got, want) <= 0.25 * 2.0 ** -7, (got, want)


def logits(t, inputs, ctx):
    """This rank's logits (B, T_local, V) of a micro-batch: the model up to the head, forward only."""
    chunk = t.chunks[0]
    h = chunk.embed.forward(inputs, ctx)[0]
    for block in chunk.blocks:
        h = block.forward(h, ctx)[0]
    return chunk.head.forward_cached(h)


PROBES = {2: [dict(cp=2), dict(cp=2, cp_kind="ulysses")], 4: [dict(cp=4)]}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dims", [GPT, LLAMA], ids=["gpt2", "llama"])
def test_a_token_of_one_document_moves_no_logit_of_another(comm, dims):
    """Perturb the token at position 9 of sequence 0: the logits of every position of another document
    stay bit for bit what they were, while those of its own document from there on change."""
    if comm.size not in PROBES:
        pytest.skip("ring cp 2 and Ulysses cp 2 on 2 ranks, ring cp 4 on 4")
    for layout in PROBES[comm.size]:
        t = trainer(comm, dims=dims, microbatches=1, **layout)
        inputs, _, contexts = t._contexts_and_batches(0)
        ctx, x = contexts[0], np.array(inputs[0])
        before = logits(t, x, ctx)
        where = np.flatnonzero(ctx.positions == 9)
        x[0, where] = (x[0, where] + 1) % dims["synthetic_vocab"]
        after = logits(t, x, ctx)
        free(t)
        docs = ctx.docs[:, ctx.positions]                                  # (B, T/cp): this rank's tokens'
        other = docs != ctx.docs[0, 9]
        other[1:] = True                                                   # other sequences: all of them
        np.testing.assert_array_equal(after[other], before[other])
        moved = comm.allreduce(int((after[~other] != before[~other]).any()))
        assert moved, f"{layout}: the perturbed document's logits did not move"
