"""Context parallelism on real ranks: every layout with cp trains the same model to the same numbers as
one rank (float64: losses of 3 AdamW steps, and every gradient of the first step)."""
import numpy as np
import pytest

from hpcpar.backend import to_numpy
from hpcpar.checkpoint import load_checkpoint, save_checkpoint
from test_checkpoint_mpi import shared_dir  # noqa: F401 (a fixture: one directory every rank sees)
from train_helpers import GPT_DIMS, LLAMA_DIMS, check_step, free, reference, rel_err, trainer

DIMS = dict(GPT_DIMS, seq_len=16, layers=4)   # 2 x cp chunks for cp up to 8
STEPS = 3
# (tp, cp, pp, dp) at world sizes 2, 4 and 8
LAYOUTS = {2: [(1, 2, 1, 1)],
           4: [(1, 4, 1, 1), (1, 2, 2, 1)],
           8: [(1, 8, 1, 1), (2, 2, 1, 2), (1, 2, 2, 2), (2, 2, 2, 1), (1, 2, 1, 4)]}


@pytest.fixture(scope="module")
def single_rank(comm):
    """The reference run (COMM_SELF, on every rank): first-step gradients by name, and the losses."""
    t = reference(comm, dims=DIMS)
    t.gradients(0)
    grads = {p.name: to_numpy(p.grad).copy() for p in t.parameters()}
    t.dp.zero_grad()
    out = grads, [t.step(s)[0] for s in range(STEPS)]
    free(t)
    return out


def layout_id(layout):
    return "tp{}cp{}pp{}dp{}".format(*layout)


def check_layout(comm, single_rank, layout, **kw):
    tp, cp, pp, dp = layout
    grads, losses = single_rank
    t = trainer(comm, dims=DIMS, tp=tp, cp=cp, pp=pp, dp=dp, microbatches=2 * pp, **kw)
    t.gradients(0)
    for p in t.parameters() if not kw.get("zero1") else ():     # ZeRO-1: each rank holds a part of them
        want = grads[p.name] if p.shard is None else p.shard.take(grads[p.name])
        # float64; the ring sums attention's softmax in another order: equal to rounding, not bit for bit
        assert rel_err(to_numpy(p.grad), want) <= 1e-10, f"{layout_id(layout)} {kw}: gradient of {p.name}"
    t.dp.zero_grad()
    got = [t.step(s)[0] for s in range(STEPS)]
    free(t)
    assert rel_err(got, losses) <= 1e-10, f"{layout_id(layout)} {kw}: losses {got} vs single rank {losses}"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("layout", [x for n in sorted(LAYOUTS) for x in LAYOUTS[n]], ids=layout_id)
def test_context_parallel_layout_matches_single_rank(comm, single_rank, layout):
    if np.prod(layout) != comm.size:
        pytest.skip(f"a layout of {np.prod(layout)} ranks")
    check_layout(comm, single_rank, layout)


@pytest.mark.mpi(min_size=4)
def test_context_parallel_with_the_other_options(comm, single_rank):
    """Sequence parallelism, ZeRO-1, and recomputation under the interleaved schedule (which redoes the
    ring in the backward, on every cp rank in the same order)."""
    if comm.size != 4:
        pytest.skip("layouts of 4 ranks")
    check_layout(comm, single_rank, (2, 2, 1, 1), sequence_parallel=True)
    check_layout(comm, single_rank, (1, 2, 1, 2), zero1=True)
    check_layout(comm, single_rank, (1, 2, 2, 1), schedule="interleaved", chunks=2, recompute=True)


@pytest.mark.mpi(min_size=2)
def test_ring_moves_the_formula_bytes(comm):
    """Per attention layer and micro-batch, each cp rank sends cp-1 key/value blocks forward, and in
    the backward cp-1 key/value blocks plus cp key/value gradient blocks: 2 (2cp - 1) + ... blocks of
    (b, heads, T/cp, HS) numbers (docs/context_parallel.md)."""
    if comm.size != 2:
        pytest.skip("2 ranks")
    t = trainer(comm, dims=DIMS, cp=2)
    t.gradients(0)
    cp, cfg, m = 2, t.mcfg, t.micro
    block = 2 * m * cfg.d_model * (cfg.seq_len // cp) * 8           # [K | V] of one rank, float64 bytes
    per_layer = (cp - 1) * block + (cp - 1) * block + cp * block     # forward K/V; backward K/V and dK/dV
    assert t.grid.cp_comm.stats.bytes["send"] == cfg.n_layer * t.cfg.microbatches * per_layer
    free(t)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("source, target", [(dict(cp=2, zero1=True), dict(dp=2)), (dict(dp=2), dict(cp=2))],
                         ids=["cp2-to-dp2", "dp2-to-cp2"])
def test_checkpoints_move_between_cp_and_other_layouts(comm, shared_dir, source, target):
    """cp shards no parameter: a checkpoint written at cp 2 loads at cp 1 and back, and training goes on
    with the numbers of a run that never stopped."""
    if comm.size != 2:
        pytest.skip("2 ranks")
    straight = trainer(comm, dims=DIMS, **source)
    want = [straight.step(s).loss for s in range(4)]
    free(straight)
    first = trainer(comm, dims=DIMS, **source)
    [first.step(s) for s in range(2)]
    save_checkpoint(first, shared_dir, 2)
    free(first)
    second = trainer(comm, dims=DIMS, **target)
    assert load_checkpoint(second, shared_dir) == 2
    got = [second.step(s).loss for s in range(2, 4)]
    free(second)
    assert rel_err(got, want[2:]) <= 1e-10, (got, want[2:])       # float64, another layout: not bit for bit


@pytest.mark.mpi(min_size=2)
def test_trace_shows_each_hop_over_the_block_it_overlaps(comm):
    """Every K/V hop of the ring is a span on the "cp" track that starts before an attention block on
    the compute track and ends after it (posted before the block, waited for after it); so is every
    dK/dV hop but the last of each backward, which carries the finished gradient home."""
    if comm.size != 2:
        pytest.skip("2 ranks")
    from hpcpar import tracer as trace
    t = trainer(comm, dims=DIMS, cp=2, microbatches=1)
    tracer = trace.start("cp", comm)
    try:
        t.gradients(0)
    finally:
        trace.stop()
        free(t)
    hops = [(name.split()[0], s, e) for name, cat, track, s, e, _ in tracer.events if track == "cp"]
    blocks = [(s, e) for name, cat, track, s, e, _ in tracer.events if cat == "ring-attention"]
    layers = DIMS["layers"]
    assert len(blocks) == layers * 2 * 2                # two blocks forward, two backward, per layer
    over_a_block = [kind for kind, hs, he in hops if any(hs <= bs and be <= he for bs, be in blocks)]
    assert [kind for kind, _, _ in hops].count("kv") == over_a_block.count("kv") == 2 * layers
    assert [kind for kind, _, _ in hops].count("dkv") == 2 * layers
    assert over_a_block.count("dkv") == layers


LLAMA = dict(LLAMA_DIMS, seq_len=16)
# (layout, whether to follow the step with optimizer steps) per world size
LLAMA_LAYOUTS = {2: [dict(cp=2)],
                 4: [dict(tp=2, cp=2, recompute_attention=True)],
                 8: [dict(tp=2, cp=2, pp=2, microbatches=4), dict(cp=8), dict(cp=2, dp=4)]}


def check_step_then_losses(comm, dims, kw):
    """One step's loss and gradients, then STEPS AdamW steps' losses, equal one rank's."""
    check_step(comm, dims=dims, **kw)
    ref, t = reference(comm, dims=dims, **kw), trainer(comm, dims=dims, **kw)
    want, got = [ref.step(s).loss for s in range(STEPS)], [t.step(s).loss for s in range(STEPS)]
    free(t)
    free(ref)
    assert rel_err(got, want) <= 1e-10, f"{kw}: losses {got} vs one rank {want}"


@pytest.mark.mpi(min_size=2)
def test_llama_with_context_parallelism_matches_one_rank(comm):
    """Rotary positions by global position, grouped-query K/V repeated before the ring: one step's
    loss and gradients, then three AdamW steps' losses, equal one rank's."""
    if comm.size not in LLAMA_LAYOUTS:
        pytest.skip("layouts of 2, 4 or 8 ranks")
    for kw in LLAMA_LAYOUTS[comm.size]:
        check_step_then_losses(comm, LLAMA, kw)


# Ulysses (--cp-kind ulysses): (tp, cp, pp, dp) at world sizes 2, 4 and 8; the heads (8) per tp rank divide by cp
ULYSSES_LAYOUTS = {2: [(1, 2, 1, 1)], 4: [(1, 4, 1, 1), (2, 2, 1, 1)], 8: [(2, 2, 1, 2)]}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("layout", [x for n in sorted(ULYSSES_LAYOUTS) for x in ULYSSES_LAYOUTS[n]], ids=layout_id)
def test_ulysses_layout_matches_single_rank(comm, single_rank, layout):
    if np.prod(layout) != comm.size:
        pytest.skip(f"a layout of {np.prod(layout)} ranks")
    check_layout(comm, single_rank, layout, cp_kind="ulysses")


@pytest.mark.mpi(min_size=4)
def test_ulysses_with_the_other_options(comm, single_rank):
    """Sequence parallelism, ZeRO-1, selective recomputation, and full recomputation under the
    interleaved schedule (which runs the forward all-to-alls again in the backward)."""
    if comm.size != 4:
        pytest.skip("layouts of 4 ranks")
    check_layout(comm, single_rank, (2, 2, 1, 1), cp_kind="ulysses", sequence_parallel=True)
    check_layout(comm, single_rank, (1, 2, 1, 2), cp_kind="ulysses", zero1=True, recompute_attention=True)
    check_layout(comm, single_rank, (1, 2, 2, 1), cp_kind="ulysses", schedule="interleaved", chunks=2,
                 recompute=True)


ULYSSES_LLAMA = dict(LLAMA, heads=8, kv_heads=4)          # tp 2 x cp 2: 2 K/V heads per tp rank, 1 per cp rank
ULYSSES_LLAMA_LAYOUTS = {2: [dict(cp=2)], 4: [dict(tp=2, cp=2)]}


@pytest.mark.mpi(min_size=2)
def test_llama_with_ulysses_matches_one_rank(comm):
    """Grouped K/V moved as their NKV heads and repeated after the all-to-all: one step's loss and
    gradients, then three AdamW steps' losses, equal one rank's."""
    if comm.size not in ULYSSES_LLAMA_LAYOUTS:
        pytest.skip("layouts of 2 or 4 ranks")
    for kw in ULYSSES_LLAMA_LAYOUTS[comm.size]:
        kw = dict(kw, cp_kind="ulysses")
        check_step_then_losses(comm, ULYSSES_LLAMA, kw)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("cp_kind", ["ring", "ulysses"])
def test_heads_wider_than_hidden_over_heads_match_one_rank(comm, cp_kind):
    """head_dim 6 over hidden 32 / 8 heads = 4 (Qwen3's shape), tp 2 x cp 2 with sequence parallelism: the
    ring passes and Ulysses moves heads of 6."""
    if comm.size != 4:
        pytest.skip("tp 2 x cp 2")
    check_step(comm, tp=2, cp=2, cp_kind=cp_kind, sequence_parallel=True, dims=dict(ULYSSES_LLAMA, head_dim=6))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dims", [DIMS, ULYSSES_LLAMA], ids=["gpt2", "llama"])
def test_ulysses_moves_the_formula_bytes_and_traces_them(comm, dims):
    """Per attention layer and micro-batch each cp rank hands the all-to-alls 4 B (T/cp) HS (NH + NKV)
    numbers (docs/context_parallel.md, ``ulysses_bytes``): Q, K, V and O forward, dO and dQ, dK, dV
    backward - the count of one step's gradients, and in a trace four spans on the "cp" track per layer
    and micro-batch whose bytes add up to the same."""
    if comm.size != 2:
        pytest.skip("2 ranks")
    from hpcpar.context_parallel.ulysses import ulysses_bytes
    from hpcpar import tracer as trace
    t = trainer(comm, dims=dims, cp=2, cp_kind="ulysses")
    cfg = t.mcfg
    want = cfg.n_layer * t.cfg.microbatches * ulysses_bytes(t.micro, cfg.seq_len, 2, cfg.d_model // cfg.n_head,
                                                            cfg.n_head, cfg.n_kv_head, 8)
    tracer = trace.start("cp", comm)
    try:
        t.gradients(0)
    finally:
        trace.stop()
        free(t)
    assert t.grid.cp_comm.stats.bytes["all_to_all"] == want
    spans = [(name, args["bytes"]) for name, cat, track, s, e, args in tracer.events if cat == "ulysses"]
    assert len(spans) == 4 * cfg.n_layer * t.cfg.microbatches and sum(b for _, b in spans) == want
    assert {name for name, _ in spans} == {"a2a qkv", "a2a o", "a2a do", "a2a dqkv"}
