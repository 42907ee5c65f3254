"""One model arithmetic for engine and planner (hpcpar/shape.py), and no family test outside the registry.

For every engine preset (GPT-2 and Llama) the planner's view of a run - the shape it builds from the
run's GPTConfig, its parameters per block and per pipeline stage, its FLOPs per block, its stage split
- is held to the engine's: the parameter arrays the engine really allocates (counted, not computed), its
FLOP count, its partition.  The MLP model's stages are cut by the same partition.  Pure: no MPI.
"""
import re
from pathlib import Path

import pytest

from hpcpar.training.config import TrainConfig, check
from hpcpar.flops import gpt_block_forward_flops, gpt_head_forward_flops
from hpcpar.nn.gpt import GPT, PRESETS, preset
from hpcpar.nn.mlp_model import MLPConfig, MLPModel
from hpcpar.pipeline.partition import partition
from hpcpar.tools.plan.flops import layer_gemms, logits_gemm
from hpcpar.tools.plan.memory import stage_params
from hpcpar.tools.plan.measured import planner_view

ROOT = Path(__file__).resolve().parent.parent
LAYERS = 6


def engine_cfg(name):
    """The preset with 6 layers and a small vocabulary (GPT-2's 50257 rows would only cost time)."""
    return preset(name, n_layer=LAYERS, vocab_size=PRESETS[name].vocab_size and 256 or 32)


def run(world=1, **flags):
    """An hpcpar train configuration of engine_cfg's 6 layers as checked for ``world`` ranks (dp,
    micro-batches, chunks filled in; check refuses a model the layout cannot hold)."""
    return check(TrainConfig(**{"layers": LAYERS, **flags}), world)


def arrays(params):
    return sum(p.data.size for p in params)


@pytest.mark.parametrize("name", list(PRESETS))
def test_planner_counts_a_block_as_the_engine_allocates_it(name):
    cfg = engine_cfg(name)
    job, _ = planner_view(run(model=name), cfg)
    for i in (0, LAYERS - 1):              # DeepSeek's first block is dense, its last has experts
        block = GPT(cfg, layers=[i], first=False, last=False).blocks[0]
        assert job.model.layer_params(i) == arrays(block.parameters()) == cfg.block_params(i)
        per_token = sum(g.flops for g in layer_gemms(job.model, 1, cfg.seq_len, 1, layer=i)) / cfg.seq_len
        assert per_token == cfg.shape.block_forward_flops(cfg.seq_len, i)
    assert job.model.layer_params() == cfg.block_params(LAYERS - 1)
    assert sum(g.flops for g in layer_gemms(job.model, 1, cfg.seq_len, 1)) / cfg.seq_len == gpt_block_forward_flops(cfg)
    assert logits_gemm(job.model, 1, cfg.seq_len, 1).flops / cfg.seq_len == gpt_head_forward_flops(cfg)


@pytest.mark.parametrize("name", ["llama-tiny", "qwen3-moe-tiny"])
def test_planner_counts_heads_of_their_own_width(name):
    """Heads of head_dim 24, not hidden / heads = 16 (Qwen3's released shapes): the planner's block
    parameters and GEMMs follow the engine's arrays, not h."""
    cfg = preset(name, n_layer=LAYERS, vocab_size=32, head_dim=24)
    job, layout = planner_view(run(model=name, head_dim=24), cfg)
    block = GPT(cfg, layers=[0], first=False, last=False).blocks[0]
    assert job.model.attention_width == 96 != cfg.d_model
    assert job.model.layer_params() == arrays(block.parameters())
    per_token = sum(g.flops for g in layer_gemms(job.model, 1, cfg.seq_len, 1)) / cfg.seq_len
    assert per_token == gpt_block_forward_flops(cfg)


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("pp", [1, 2, 4])
def test_planner_stages_are_the_engines(name, pp):
    """6 layers on pp 4: the engine cuts [2, 2, 1, 1], and so does the planner; each stage's parameters
    (the tied embedding's copy on the last stage included) are the arrays the engine holds there."""
    cfg = engine_cfg(name)
    job, layout = planner_view(run(pp, model=name, pp=pp, batch_size=4 * pp), cfg)
    ranges = partition(cfg.n_layer, pp, TrainConfig().partition, cfg)
    assert list(job.stage_layers(layout)) == [len(r) for r in ranges]
    for s, blocks in enumerate(ranges):
        stage = GPT(cfg, layers=blocks, first=s == 0, last=s == pp - 1)
        assert stage_params(job, layout, s) == arrays(stage.parameters())


def test_six_layers_on_four_stages():
    job, layout = planner_view(run(4, model="llama-tiny", pp=4), engine_cfg("llama-tiny"))
    assert job.stage_layers(layout) == (2, 2, 1, 1)
    assert job.model.layer_params() == 46_208


def test_the_mlp_model_is_cut_by_the_same_partition():
    cfg = MLPConfig(n_layer=LAYERS)
    job, layout = planner_view(run(4, model="tiny", pp=4), engine_cfg("tiny"))
    ranges = partition(cfg.n_layer, 4, TrainConfig().partition, cfg)
    assert [len(MLPModel(cfg, layers=r, first=i == 0, last=i == 3).blocks) for i, r in enumerate(ranges)] \
        == list(job.stage_layers(layout))


def test_a_run_keeps_cp_recomputation_and_zero_as_the_planner_sees_it():
    cfg = engine_cfg("tiny")
    _, layout = planner_view(run(4, model="tiny", cp=2, recompute_attention=True, zero1=True), cfg)
    assert (layout.cp, layout.recompute, layout.zero) == (2, "selective", 1)
    assert "-cp2" in str(layout) and "-z1" in str(layout) and "-rcsel" in str(layout)
    _, layout = planner_view(run(model="tiny", recompute=True), cfg)
    assert (layout.cp, layout.recompute, layout.zero) == (1, "full", 0)


# Family names and block classes may be tested only where the family is defined (the registry) or
# where its files are read (checkpoint/gpt2.py and llama.py, chosen through checkpoint/hf.FAMILIES).
FAMILY_TEST = re.compile(r"""(==|!=)\s*["'](gpt2|llama)["']|["'](gpt2|llama)["']\s*(==|!=)"""
                         r"""|startswith\(["'](gpt2|llama)|\bif\b[^:]*\bin\s*\(\s*["'](gpt2|llama)["']\s*,"""
                         r"""|isinstance\([^)]*\b(LlamaBlock|TransformerBlock)\b""")
REGISTRY = {"hpcpar/nn/gpt.py", "hpcpar/checkpoint/gpt2.py", "hpcpar/checkpoint/llama.py"}


def test_no_family_test_outside_the_registry():
    found = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
             for path in sorted((ROOT / "hpcpar").rglob("*.py")) if str(path.relative_to(ROOT)) not in REGISTRY
             for i, line in enumerate(path.read_text().splitlines(), 1) if FAMILY_TEST.search(line)]
    assert not found, "a family trait belongs in nn/gpt.py's ARCHITECTURES:\n" + "\n".join(found)


# (world, options): ZeRO 0-3 as the planner and the engine's formula see them
ZERO_RUNS = [(2, dict(dp=2, zero=z)) for z in range(4)] + [
    (4, dict(dp=4, zero=3)), (8, dict(dp=8, zero=2)), (4, dict(dp=2, tp=2, zero=3)), (4, dict(dp=2, cp=2, zero=3)),
    (4, dict(dp=2, pp=2, zero=3, microbatches=4)), (4, dict(dp=2, pp=2, zero=2, microbatches=2))]


@pytest.mark.parametrize("world, options", ZERO_RUNS, ids=[str(o) for _, o in ZERO_RUNS])
def test_planner_zero_terms_are_the_engines_formula(world, options):
    """One table (data_parallel/zero_memory.py: per_rank) for both: the planner's weights, gradients,
    optimizer state and ZeRO working set of every pipeline stage are the engine's formula, which the
    engine's own arrays are held to (tests/test_zero_mpi.py, hpcpar bench --only zero)."""
    from hpcpar.data_parallel.zero_memory import TERMS, formula
    from hpcpar.tools.plan.memory import stage_memory
    cfg = engine_cfg("tiny")
    c = run(world, model="tiny", batch_size=8, **options)
    job, layout = planner_view(c, cfg)
    for s in range(c.pp):
        planned = stage_memory(job, layout, s, 1)
        want = formula(c, cfg, s)
        # the formula counts TP-replicated norms and biases as cut (/tp), the planner once a rank
        close = 0.02 if c.tp > 1 else 1e-12
        assert {k: planned.get(k, 0) for k in TERMS} == pytest.approx(want, rel=close), (s, options)


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("schedule, pp", [("zb-v", 2), ("zb-v", 3), ("dualpipev", 2), ("interleaved", 3),
                                          ("zb-h2", 2)])
def test_planner_ranks_hold_what_the_schedule_places(name, schedule, pp):
    """A rank holds the virtual stages its schedule places there (a V: stage r and 2p-1-r, so rank 0 has
    the embedding and the head, tied in memory rather than copied): the planner's layers and parameters
    per rank are the arrays of the chunks the engine builds there (training/step.py's _build_chunks); 4 layers
    where 6 would not divide into 2 pp equal chunks (a chunked schedule refuses it)."""
    from hpcpar.pipeline.schedules import build
    layers = 2 * pp if LAYERS % (2 * pp) else LAYERS
    cfg = preset(name, n_layer=layers, vocab_size=engine_cfg(name).vocab_size)
    c = run(pp, model=name, pp=pp, schedule=schedule, microbatches=2 * pp, batch_size=4 * pp, layers=layers)
    job, layout = planner_view(c, cfg)
    S = pp * c.chunks
    ranges, placed = partition(cfg.n_layer, S, c.partition, cfg), build(schedule, pp, 2 * pp, c.chunks)
    for rank in range(pp):
        chunks = {placed.stage(rank, k): None for k in range(c.chunks)}
        for s in chunks:
            chunks[s] = GPT(cfg, layers=ranges[s], first=s == 0, last=s == S - 1)
        if cfg.tied and 0 in chunks and S - 1 in chunks:
            chunks[S - 1].head.weight = chunks[0].embed.wte
        held = {id(p): p for chunk in chunks.values() for p in chunk.parameters()}
        assert job.stage_layers(layout)[rank] == sum(len(ranges[s]) for s in chunks)
        assert stage_params(job, layout, rank) == arrays(held.values())
    assert job.ends(layout) == placed.ends()


@pytest.mark.parametrize("pp", [1, 2])
def test_planner_counts_the_mtp_modules_on_the_last_stage(pp):
    """DeepSeek-tiny with two MTP modules: the last stage's arrays - the modules, and on a pipeline their copy of
    the token embedding - are the planner's, and the whole model's are its params + mtp_params."""
    cfg = preset("deepseek-tiny", n_layer=LAYERS, vocab_size=32, mtp_depth=2)
    job, layout = planner_view(run(pp, model="deepseek-tiny", pp=pp, mtp=2, batch_size=4 * pp), cfg)
    for s, blocks in enumerate(partition(cfg.n_layer, pp, TrainConfig().partition, cfg)):
        stage = GPT(cfg, layers=blocks, first=s == 0, last=s == pp - 1)
        assert stage_params(job, layout, s) == arrays(stage.parameters())
    assert cfg.n_params() == job.model.params(cfg.n_positions) + job.model.mtp_params() == arrays(GPT(cfg).parameters())
