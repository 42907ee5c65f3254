"""The model state a rank holds under ZeRO 0-3: counted from the engine's own arrays, and the formula for it,
which ``--memory-budget`` checks before anything is allocated.

Per rank, P numbers of its pipeline stage (its TP shard), n = dp x cp, b bytes a number (c under mixed
precision: the compute copy's), U the largest unit (ZeRO-3: a block, --fsdp-blocks of them, or the
token embedding):

    term              ZeRO 0    ZeRO 1          ZeRO 2     ZeRO 3
    weights           P b (+ P c: the compute copy)         P b / n
    gradients         P b       P b + P b / n   P b / n    P b / n
    optimizer state   k P b     k P b / n       k P b / n  k P b / n    (AdamW k = 3: two moments and a
                                                                         scratch array; SGD k = 1 or 0)
    working set       0         0               P b        U (2 c + 2 b), or P c + 2 U b without
                                                                         --reshard-after-forward

The working set is what a step adds at once: ZeRO-2's full gradient buffers during the backward;
ZeRO-3's unit in use and the prefetched one (gathered, compute dtype), the gradient being computed
and the one being reduce-scattered (fsdp.py keeps at most one in flight).  ``held`` counts the same
terms from the arrays; ``hpcpar bench --only zero`` sets the two, and the planner, side by side.
"""
from hpcpar.runtime import UsageError

GB = 1e9
TERMS = ("weights", "gradients", "optimizer state", "working set")


def held(trainer):
    """{term: bytes} this rank holds now (between steps), and the working set of the last step."""
    dp, opt = trainer.dp, trainer.optimizer
    optimizer = sum(a.nbytes for st in opt.state.values() for a in st.values()) + \
        sum(a.nbytes for a in opt._scratch.values())
    if dp.zero == 3:
        weights = sum(u.shard.nbytes for u in dp.units)
        grads = sum(u.shard_grad.nbytes for u in dp.units)
        working = dp.peak_gathered
    else:
        weights = sum(b.data.nbytes + (b.compute.nbytes if b.compute is not b.data else 0) for b in dp.buckets)
        full = sum(b.size * b.data.itemsize for b in dp.buckets)
        grads = (full if dp.zero < 2 else 0) + sum(g.nbytes for g in dp._owned_grads or ())
        working = full if dp.zero == 2 else 0
    return {"weights": weights, "gradients": grads, "optimizer state": optimizer, "working set": working}


def rank_params(cfg, mcfg, pp_rank):
    """(P, U): the numbers a rank of pipeline rank ``pp_rank`` holds (its TP shard, replicated norms
    and biases counted as cut too), and its largest ZeRO-3 unit."""
    from hpcpar.pipeline.partition import partition
    from hpcpar.pipeline.schedules import build
    schedule = build(cfg.schedule, cfg.pp, cfg.microbatches, cfg.chunks)
    S = cfg.pp * cfg.chunks
    ranges = partition(mcfg.n_layer, S, cfg.partition, mcfg)
    stages = [schedule.stage(pp_rank, c) for c in range(cfg.chunks)]
    total, unit = 0, 0
    for s in stages:
        blocks = len(ranges[s])
        total += blocks * mcfg.block_params()
        unit = max(unit, min(blocks, cfg.fsdp_blocks) * mcfg.block_params())
        if s == 0:
            total += mcfg.embedding_params()
            unit = max(unit, mcfg.vocab_size * mcfg.d_model)
        if s == S - 1:
            copy = not mcfg.tied or 0 not in stages          # a tied weight on another rank: a copy here
            total += mcfg.head_params(copy)
            unit = max(unit, mcfg.vocab_size * mcfg.d_model if copy else mcfg.head_params(False))
    return total / cfg.tp, unit / cfg.tp


def formula(cfg, mcfg, pp_rank=0):
    """{term: bytes} on a rank of pipeline rank ``pp_rank``, by the table above."""
    import numpy as np
    P, U = rank_params(cfg, mcfg, pp_rank)
    n, z = cfg.dp * cfg.cp, cfg.zero
    b = np.dtype(cfg.dtype).itemsize
    c = {"fp16": 2, "bf16": 2}.get(cfg.precision, b)
    k = 3 if cfg.optimizer == "adamw" else (1 if cfg.momentum else 0)
    weights = P * b / n if z == 3 else P * b + (P * c if c != b else 0)
    grads = {0: P * b, 1: P * b + P * b / n}.get(z, P * b / n)
    working = {2: P * b, 3: U * (2 * c + 2 * b) if cfg.reshard_after_forward else P * c + 2 * U * b}.get(z, 0)
    return {"weights": weights, "gradients": grads, "optimizer state": k * P * b / (n if z else 1),
            "working set": working}


def check_budget(cfg, mcfg):
    """Refuse, in one line with the numbers, a run whose ranks would hold more model state than
    --memory-budget GB (options only: every rank decides the same, before any communication)."""
    if not cfg.memory_budget:
        return
    totals = [formula(cfg, mcfg, r) for r in range(cfg.pp)]
    worst = max(range(cfg.pp), key=lambda r: sum(totals[r].values()))
    terms = totals[worst]
    total = sum(terms.values())
    if total > cfg.memory_budget * GB:
        parts = ", ".join(f"{k} {v / GB:.3g}" for k, v in terms.items() if v)
        raise UsageError(f"--memory-budget {cfg.memory_budget:g} GB: a rank of pipeline stage {worst} would hold "
                         f"{total / GB:.3g} GB ({parts}) at tp {cfg.tp} x cp {cfg.cp} x pp {cfg.pp} x dp {cfg.dp}, "
                         f"ZeRO {cfg.zero}; shard it over more ranks (--zero 3, --tp, --pp)")
