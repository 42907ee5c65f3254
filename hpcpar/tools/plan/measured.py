"""hpcpar's own peak memory per rank: measured around real training steps, and predicted by memory.py.

The measurement: a first Trainer is built and dropped untraced (imports, module caches), then
``tracemalloc`` traces the construction of the real one and two optimizer steps (the first step
creates the optimizer state, the second runs with it).  numpy reports every array it allocates to
tracemalloc, so the traced peak is the rank's peak of arrays (plus a few KB of Python objects).

The prediction: the same run as a planner Job and Layout on hpcpar's engine (numpy caches, Adam's two
moments, no allocator cache: tracemalloc counts what is requested), the rank's pipeline stage
holding the micro-batches its schedule keeps in flight.
"""
from dataclasses import replace
import gc
import tracemalloc

from hpcpar.tools.plan.job import Job
from hpcpar.tools.plan.layout import Layout
from hpcpar.tools.plan.memory import analytic_inflight, stage_memory

STEPS = 2
DTYPES = {"float32": "fp32", "float64": "fp64"}


def measure_peak(cfg, comm):
    """Peak traced bytes on this rank over the Trainer's construction and STEPS steps of ``cfg``."""
    from hpcpar.training.step import Trainer
    Trainer(cfg, comm).grid.free()      # imports and module-level caches, not counted
    gc.collect()
    tracemalloc.start()
    try:
        trainer = Trainer(cfg, comm)
        for step in range(STEPS):
            trainer.step(step)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    trainer.grid.free()
    return peak


def muon_engine(c):
    """The planner's Engine fields for an hpcpar train run's optimizer (Muon's, or AdamW's)."""
    if c.optimizer != "muon":
        return {}
    return dict(optimizer="muon", muon_tp=c.muon_tp, ns_steps=c.ns_steps, ns_dtype="bf16" if c.ns_bf16 else "")


def planner_view(trainer_cfg, model_cfg):
    """(Job, Layout) of an hpcpar train run for memory.py (the hardware plays no part in memory): every
    option of the run that changes its memory - cp, the recomputation, the ZeRO stage - in the layout."""
    from hpcpar.tools.plan.local import engine_shape, recompute_policy, train_engine, zero_stage
    from hpcpar.training.models import micro_batch
    c = trainer_cfg
    ranks = c.tp * c.cp * c.pp * c.dp
    job = Job(engine_shape(model_cfg, c.model), None, ranks, ranks, c.batch_size, model_cfg.seq_len,
              dtype=DTYPES[c.dtype], engine=replace(train_engine(**muon_engine(c)), fp8_param_gather=c.fp8_param_gather))
    layout = Layout(c.tp, c.pp, c.dp, mb=micro_batch(c), v=c.chunks,
                    schedule=c.schedule, recompute=recompute_policy(c), zero=zero_stage(c),
                    sp=c.sequence_parallel, cp=c.cp, ep=c.ep, dp_shard=c.dp_shard)
    return job, layout


def predict_peak(trainer_cfg, model_cfg, stage):
    """memory.py's bytes on a rank of pipeline stage ``stage``, by term."""
    job, layout = planner_view(trainer_cfg, model_cfg)
    inflight = analytic_inflight(layout.schedule, layout.pp, job.micro_batches(layout), layout.v, stage)
    return stage_memory(job, layout, stage, inflight)
