"""The model state a rank holds under ZeRO 0-3: the one table of it (``per_rank``, which the planner's
tools/plan/memory.py uses too), the engine's run put into it (``formula``: what --memory-budget checks before
anything is allocated), and the same counted from the engine's own arrays (``held``).

Per rank, P numbers of its pipeline stage (its TP shard), n = dp x cp the ranks ZeRO cuts the state
over (HSDP: a shard group's dp-shard x cp; replicated across the groups, it costs nothing more), U the
largest unit (ZeRO-3: a block, --fsdp-blocks of them, or the token embedding); bytes a number: m of
the weights the optimizer updates, r of a compute copy kept beside them (mixed precision; 0 without
one), g of a gradient, o of the optimizer state (ZeRO-1 shards it), c of a gathered number (the
compute dtype).  A mixture of experts' routed experts (X numbers, E/ep of them on a rank) follow the
same table with n / ep for n: their replicas are the ranks of dp x cp that hold the same experts.
Under ZeRO-3 a block's experts are a unit of their own over that group, gathered with the block's
other unit (U counts both); over a group of one rank (ep >= n) they stay whole under any stage -
ZeRO-0's column, X (m + r) + X g + X o, nothing gathered.  So do, under ZeRO-3, DeepSeek-V3's routing biases (R numbers: E a block, part of P under
ZeRO 0-2), which every rank keeps whole and moves by a rule (data_parallel/fsdp.py).

    term              ZeRO 0    ZeRO 1          ZeRO 2     ZeRO 3
    weights           P (m + r)                            P m / n
    gradients         P g       P g + P g / n   P g / n    P g / n
    optimizer state   P o       P o / n         P o / n    P o / n
    ZeRO working set  0         0               P g        2 U c + 2 U g

hpcpar: m = g = b (the dtype's bytes), r = 2 under --precision bf16/fp16, o = 2 b for AdamW (its two
moments; SGD b with momentum, else 0); Muon keeps b (its momentum) for each number of the blocks'
matrices (optim/matrices.py ``matrix_split``) and AdamW's 2 b for the rest.  With --fp8-param-gather a
ZeRO-3 unit's quantised weights (shape.py ``quantised_params``) are gathered - held and sent - as FP8
codes, one byte each: c is then ``gathered_number_bytes``, the compute dtype's bytes and one byte
weighed by their share.  The update's one scratch block (optim/__init__.py: 256 KB on a host, a
slice on a GPU) is work space, not state, and not counted.  ZeRO-1's second gradient term is the
slice its reduce-scatter fills (an engine that reduce-scatters into the full buffer has none).  The
working set is what a step adds at once: ZeRO-2's full gradient buffers during the backward;
ZeRO-3's unit in use and the prefetched one (gathered, compute dtype), the gradient being computed
and the one being reduce-scattered (fsdp.py keeps at most one in flight).  Without
--reshard-after-forward every unit stays gathered from its forward to its backward: P c instead of
2 U c; where a unit's gradient must outlive one backward (several micro-batches a step: hpcpar
reduce-scatters once, after the last) the whole stage's: P g instead of 2 U g.
``hpcpar bench --only zero`` sets ``held``, ``formula`` and the planner side by side.
"""
from hpcpar.optim import state_arrays
from hpcpar.optim.matrices import matrix_split
from hpcpar.runtime import UsageError

GB = 1e9
TERMS = ("weights", "gradients", "optimizer state", "ZeRO working set")
FP8_BYTES = 1


def gathered_number_bytes(compute, fp8_share=0.0):
    """Bytes of one number ZeRO-3 gathers, held and sent: the compute dtype's, and for the share of them
    --fp8-param-gather sends as FP8 codes (fp8_gather.py), one byte."""
    return compute + (FP8_BYTES - compute) * fp8_share


def fp8_gather_share(shape, tp, ep, shard):
    """The share of a block's ZeRO-3 unit that --fp8-param-gather gathers in FP8: its quantised matrices."""
    return shape.quantised_params() / tp / shape.gathered_block_params(tp, ep, shard)


def held(trainer):
    """{term: bytes} this rank holds now (between steps), and the working set of the last step."""
    dp, opt = trainer.dp, trainer.optimizer
    optimizer = sum(a.nbytes for st in opt.state.values() for a in st.values())
    weights = sum(f.weight_bytes() for f in dp.flats)
    grads = sum(f.grad_bytes() for f in dp.flats)
    freed = sum(f.size * f.master.itemsize for f in dp.flats if f.grad is None)    # ZeRO-2: alive in the backward
    working = dp.peak_gathered if dp.zero == 3 else freed
    return {"weights": weights, "gradients": grads, "optimizer state": optimizer, "ZeRO working set": working}


def shard_size(dp, cp, dp_shard=0):
    """n: the ranks ZeRO cuts a parameter's state over - dp x cp, or under HSDP a shard group's
    dp-shard x cp (the state is then replicated across the dp / dp-shard groups); the engine's and the
    planner's (tools/plan/layout.Layout.shard)."""
    return (dp_shard or dp) * cp


def rank_params(cfg, mcfg, pp_rank):
    """(P, X, U, R): the numbers a rank of pipeline rank ``pp_rank`` holds outside the routed experts (its
    TP shard, replicated norms and biases counted as cut too; a mixture of experts' router and shared
    experts whole: the MoE layer is not cut over TP), those of its routed experts (E/ep of each
    block's, whole on every TP rank), its largest ZeRO-3 unit, and of P its routing biases (E a block)."""
    S = cfg.pp * cfg.chunks
    shape = mcfg.shape
    dense, routed = shape.block_split(cfg.tp, cfg.ep)              # a block's numbers outside / in its experts
    bias = shape.routing_bias_params()                             # the routing bias: never gathered
    block = shape.gathered_block_params(cfg.tp, cfg.ep, shard_size(cfg.dp, cfg.cp, cfg.dp_shard))     # a block's ZeRO-3 unit
    total, experts, unit, biases = 0, 0, 0, 0
    held = rank_blocks(cfg, mcfg, pp_rank)
    stages = [s for s, _ in held]
    for s, blocks in held:
        total += blocks * dense
        experts += blocks * routed
        biases += blocks * bias
        unit = max(unit, min(blocks, cfg.fsdp_blocks) * block)
        if s == 0:
            total += mcfg.embedding_params() / cfg.tp
            unit = max(unit, mcfg.vocab_size * mcfg.d_model / cfg.tp)
        if s == S - 1:
            copy = not mcfg.tied or 0 not in stages          # a tied weight on another rank: a copy here
            total += mcfg.head_params(copy) / cfg.tp
            unit = max(unit, (mcfg.vocab_size * mcfg.d_model if copy else mcfg.head_params(False)) / cfg.tp)
    return total, experts, unit, biases


def rank_blocks(cfg, mcfg, pp_rank):
    """[(virtual stage, its blocks)] of the chunks a rank of pipeline rank ``pp_rank`` holds."""
    from hpcpar.pipeline.partition import partition
    from hpcpar.pipeline.schedules import build
    schedule = build(cfg.schedule, cfg.pp, cfg.microbatches, cfg.chunks)
    ranges = partition(mcfg.n_layer, cfg.pp * cfg.chunks, cfg.partition, mcfg)
    return [(s, len(ranges[s])) for s in (schedule.stage(pp_rank, c) for c in range(cfg.chunks))]


def per_rank(zero, n, params, unit, *, master, grad, optimizer, compute, copy=0, slice_buffer=True,
             reshard=True, whole_grads=False, matrices=0, matrix_optimizer=None):
    """{term: bytes} of the table above: ``params`` P and ``unit`` U numbers, the rest bytes a number
    (``slice_buffer``: ZeRO-1 reduce-scatters into a slice of its own; ``reshard``: ZeRO-3 frees a
    unit after its forward; ``whole_grads``: ZeRO-3 holds the stage's whole gradient).  ``matrices`` of
    the P numbers keep ``matrix_optimizer`` bytes of state a number instead (Muon's one momentum)."""
    P, U = params, unit
    state = P * optimizer + (matrices * (matrix_optimizer - optimizer) if matrix_optimizer is not None else 0)
    weights = P * master / n if zero >= 3 else P * (master + copy)
    if zero >= 2:
        grads = P * grad / n
    else:
        grads = P * grad + (P * grad / n if zero == 1 and slice_buffer and n > 1 else 0)
    working = 0
    if zero == 2:
        working = P * grad
    elif zero >= 3:
        working = (2 * U if reshard else P) * compute + (P if whole_grads else 2 * U) * grad
    return {"weights": weights, "gradients": grads, "optimizer state": state / (n if zero else 1),
            "ZeRO working set": working}


def formula(cfg, mcfg, pp_rank=0):
    """{term: bytes} on a rank of pipeline rank ``pp_rank`` of this run, by the table above."""
    import numpy as np
    from hpcpar.precision import elsewhere
    P, X, U, R = rank_params(cfg, mcfg, pp_rank)
    b = np.dtype(cfg.dtype).itemsize
    c = {"fp16": 2, "bf16": 2}.get(elsewhere(cfg.precision, cfg.fp8_rest), b)
    k, km = (state_arrays(cfg.optimizer, cfg.momentum, matrix) for matrix in (False, True))
    n = shard_size(cfg.dp, cfg.cp, cfg.dp_shard)
    gathered = gathered_number_bytes(c, fp8_gather_share(mcfg.shape, cfg.tp, cfg.ep, n)) if cfg.fp8_param_gather else c
    blocks = sum(b for _, b in rank_blocks(cfg, mcfg, pp_rank))
    matrices = tuple(blocks * m for m in matrix_split(mcfg.shape, cfg.tp, cfg.ep))     # Muon's (dense, routed)
    return with_experts(cfg.zero, n, cfg.ep, P, X, U, R, matrices, master=b, copy=c if c != b else 0, grad=b,
                        optimizer=k * b, matrix_optimizer=km * b, compute=gathered, reshard=cfg.reshard_after_forward,
                        whole_grads=cfg.microbatches > 1)


def with_experts(zero, n, ep, params, experts, unit, resident=0, matrices=(0, 0), **numbers):
    """``per_rank`` of a rank holding ``params`` numbers replicated over ``n`` ranks (``resident`` of
    them kept whole on every rank even under ZeRO-3: the routing biases) and ``experts`` routed-expert
    numbers over their own group, the n / ep ranks holding the same experts.  Under ZeRO-3 ``unit``
    counts a block's gathered experts already; over a group of one rank they stay whole, as under ZeRO-0
    (flat.FlatBuffer.resident).  ``matrices``: Muon's (dense, routed) numbers among them (per_rank).  The
    engine's formula and the planner (tools/plan/experts.py) both."""
    dense, routed = matrices
    parts = [per_rank(zero, n, params - resident, unit, matrices=dense, **numbers),
             per_rank(0, n, resident, 0, **numbers)] \
        if zero == 3 and resident else [per_rank(zero, n, params, unit, matrices=dense, **numbers)]
    if experts:
        parts.append(per_rank(experts_stage(zero, n, ep), max(1, n // ep), experts, 0, matrices=routed, **numbers))
    return {term: sum(part[term] for part in parts) for term in TERMS}


def experts_stage(zero, n, ep):
    """The ZeRO stage a rank's routed experts are held at: the run's, except over a group of one rank
    (ep >= n), where they stay whole - ZeRO-0's column (flat.py: a resident buffer)."""
    return zero if n // ep > 1 else 0


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
