"""The model state a rank holds under ZeRO 0-3: counted from the engine's own arrays, and predicted by the
planner's formula (plan/memory.py) - which ``--memory-budget`` checks before anything is allocated.

Counted (``held``), per rank, in bytes:
    weights           the flat buffers of master weights (and their compute copy under mixed precision);
                      ZeRO-3: this rank's slices only
    gradients         between steps: the full gradient buffers (ZeRO 0, 1) and the reduce-scattered slices
                      (ZeRO 1, 2, 3)
    optimizer state   every array the optimizer keeps: its state of this rank's slices and its scratch
    working set       the most bytes held at once during a step beyond those: ZeRO-2's full gradient
                      buffers in the backward, ZeRO-3's gathered units and their full gradients
"""
from dataclasses import replace

from hpcpar.runtime import UsageError

GB = 1e9
# the planner's terms that are model state (the rest of its prediction - activations, buffers - is not)
STATE_TERMS = ("weights", "gradients", "optimizer state", "ZeRO gradient shard", "FSDP gathered units",
               "FSDP gathered stage")


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


def predicted(cfg, mcfg):
    """The planner's state terms {term: bytes} on a rank of each pipeline stage of this run."""
    from hpcpar.plan.measured import planner_view
    from hpcpar.plan.memory import stage_memory
    job, layout = planner_view(cfg, mcfg)
    layout = replace(layout, zero=cfg.zero, cp=cfg.cp)
    out = []
    for stage in range(cfg.pp):
        terms = stage_memory(job, layout, stage, 1)
        out.append({k: v for k, v in terms.items() if k in STATE_TERMS})
    return out


def check_budget(cfg, mcfg):
    """Refuse, in one line with the numbers, a run whose ranks would hold more model state than
    --memory-budget GB (options only: every rank decides the same, before any communication)."""
    if not cfg.memory_budget:
        return
    stages = predicted(cfg, mcfg)
    worst = max(range(len(stages)), key=lambda s: sum(stages[s].values()))
    terms = stages[worst]
    total = sum(terms.values())
    if total > cfg.memory_budget * GB:
        parts = ", ".join(f"{k} {v / GB:.3g}" for k, v in terms.items() if v)
        raise UsageError(f"--memory-budget {cfg.memory_budget:g} GB: a rank of pipeline stage {worst} would hold "
                         f"{total / GB:.3g} GB ({parts}) at tp {cfg.tp} x cp {cfg.cp} x pp {cfg.pp} x dp {cfg.dp}, "
                         f"ZeRO {cfg.zero}; shard it over more ranks (--zero 3, --tp, --pp)")
