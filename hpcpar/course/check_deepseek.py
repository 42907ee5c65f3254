"""DeepSeek-V3: what multi-head latent attention caches a token against grouped-query attention
(hpcpar/shape.py, docs/deepseek.md "What generation caches"), and where a pipeline puts the multi-token
prediction modules and which gradients it sums between its ends (pipeline/schedules.py, nn/gpt.py,
training/step.py; docs/deepseek.md "Multi-token prediction")."""
from dataclasses import replace
from functools import lru_cache

from hpcpar.course.wrong import Wrong
from hpcpar.nn.gpt import GPT, preset
from hpcpar.pipeline.schedules import build
from hpcpar.tools.plan.models import load_model
from hpcpar.shape import ModelShape

FIELDS = ("layers", "heads", "kv_heads", "head_dim", "v_head_dim", "kv_lora_rank", "qk_rope_dim")


def kv_cache_bytes(model, itemsize):
    """Reference: (bytes a token the model's KV cache holds, bytes a cache of every head's own keys and
    values would hold), over all layers; ``model`` a dict of FIELDS."""
    shape = ModelShape("model", hidden=model["heads"] * model["head_dim"], vocab=0, **model)
    return itemsize * shape.kv_cache_per_token(), itemsize * shape.heads_kv_per_token()


def _models():
    """(what, the FIELDS of its shape, bytes a number): published models, the engine's tiny DeepSeek, and
    small shapes where the value width differs from the query/key width, or equals it."""
    tiny = preset("deepseek-tiny", vocab_size=32).shape
    shapes = [("DeepSeek-V3 in bf16", load_model("deepseek-v3"), 2), ("Llama 3 70B in bf16", load_model("llama3-70b"), 2),
              ("Kimi K2 in fp8", load_model("kimi-k2"), 1), ("GPT-2 in float32", load_model("gpt2"), 4),
              ("deepseek-tiny in float64", tiny, 8)]
    small = ModelShape("small", layers=3, hidden=48, heads=6, vocab=0)
    shapes += [("an MLA of values wider than its queries, float32",
                replace(small, kv_lora_rank=20, qk_rope_dim=6, head_dim=16, v_head_dim=24), 4),
               ("an MLA of values as wide as its queries, bf16",
                replace(small, layers=5, kv_lora_rank=12, qk_rope_dim=2, head_dim=8, v_head_dim=8), 2),
               ("one K/V head for 6 query heads, float64", replace(small, kv_heads=1), 8)]
    for what, shape, itemsize in shapes:
        yield what, {f: getattr(shape, f) for f in FIELDS}, itemsize


def check_kv_cache_bytes(f):
    for what, model, itemsize in _models():
        got = f(dict(model), itemsize)
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return two numbers: (the model's cache, every head's own keys and values), bytes a token")
        want = kv_cache_bytes(model, itemsize)
        for name, g, w in zip(("the cache", "every head's own keys and values"), got, want):
            if g != w:
                why = "counted for one layer" if g * model["layers"] == w else f"{g / w:.3g} times the right number"
                raise Wrong(f"{what} ({', '.join(f'{k} {v}' for k, v in model.items())}): {name} is {g:,} bytes "
                            f"a token - {why}")


# --- exercise 40: the ends of a pipeline, with multi-token prediction -------------------------------------

CASES = [(pp, "1f1b", 1, 1) for pp in (2, 3, 4)] + [(pp, "interleaved", 2, 1) for pp in (2, 3, 4)] + \
    [(2, "interleaved", 3, 2)] + [(pp, "zb-v", 2, 1) for pp in (2, 3, 4)] + [(3, "dualpipev", 2, 1)] + \
    [(3, "1f1b", 1, 0), (2, "zb-v", 2, 0)]


@lru_cache(maxsize=None)
def _ends(mtp, both):
    """The first stage's and the last stage's model chunks of deepseek-tiny with ``mtp`` modules, built as the
    trainer builds them (``both``: on one rank, tied as Trainer._build_chunks ties them)."""
    cfg = preset("deepseek-tiny", vocab_size=32, n_layer=2, mtp_depth=mtp or None)
    first = GPT(cfg, 0, "float64", layers=range(0, 1), first=True, last=False)
    last = GPT(cfg, 0, "float64", layers=range(1, 2), first=False, last=True)
    if both:
        last.tie_to(first.embed.wte)
    return cfg, first, last


def pipeline_ends(pp, schedule, chunks, mtp):
    """Reference: (where the MTP modules sit: (rank, chunk) or None, {name: pp ranks} of the gradients summed
    between pipeline ranks, the pp ranks whose copy of the token embedding the gradient norm counts)."""
    plan = build(schedule, pp, 2 * pp, chunks)
    held = plan.holders()                                  # virtual stage -> (rank, chunk)
    (first, _), (last, last_chunk) = held[0], held[len(held) - 1]
    cfg, head_first, head_last = _ends(mtp, first == last)
    assert (head_last.head.mtp is not None) == bool(mtp)   # the last stage's chunk is the one with the modules
    summed = plan.embedding_ranks(bool(cfg.tied or cfg.mtp_depth))
    tokens = cfg.parts.tokens
    counted = {r for r, chunk in ((first, head_first), (last, head_last))
               for p in chunk.parameters() if p.name == tokens and p.counted}
    return (last, last_chunk) if mtp else None, {tokens: summed} if summed else {}, tuple(sorted(counted))


def check_pipeline_ends(f):
    for pp, schedule, chunks, mtp in CASES:
        where = f"pp {pp}, {schedule}, {chunks} chunk{'s' if chunks > 1 else ''} a rank, {mtp} MTP module" \
                f"{'s' if mtp != 1 else ''}"
        want = pipeline_ends(pp, schedule, chunks, mtp)
        got = f(pp, schedule, chunks, mtp)
        if not isinstance(got, tuple) or len(got) != 3:
            raise Wrong("return three things: (where the MTP modules sit, the gradients summed, the ranks counted)")
        at, summed, counted = got
        at = None if at is None else tuple(int(x) for x in at)
        if at != want[0]:
            raise Wrong(f"{where}: the MTP modules sit at {at}, expected (rank, chunk) {want[0]}")
        summed = {str(k): tuple(int(r) for r in v) for k, v in dict(summed).items()}
        extra = sorted(set(summed) - set(want[1]))
        if extra:
            raise Wrong(f"{where}: {extra[0]} is summed between pipeline ranks - it sits on one stage only, or one "
                        f"rank holds it whole")
        for name, ranks in want[1].items():
            if summed.get(name) != ranks:
                said = f"over pp ranks {summed[name]}" if name in summed else "nowhere"
                raise Wrong(f"{where}: {name}'s gradient is summed {said}, expected over pp ranks {ranks}")
        counted = tuple(sorted(int(r) for r in counted))
        if counted != want[2]:
            raise Wrong(f"{where}: the gradient norm counts the token embedding on pp ranks {counted}, expected "
                        f"{want[2]}")
