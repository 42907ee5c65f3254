"""The four framework constants, each fitted to its own named published rows (role "framework-fitting").

All are properties of a framework's runtime that no formula gives, and none is fitted to the
rows it is judged on (docs/planning.md, Validation):

* ``gemm_efficiency`` of eager PyTorch (published.EAGER): its GEMMs and the kernels around them run
  one operation at a time, with launch gaps, below the fused kernels of Megatron-Core that the
  hardware's GEMM factor was fitted to.  Fitted like that factor (calibrate.fit_calibration): the
  step is nearly proportional to 1 / efficiency, so c <- c / (predicted throughput / published)
  converges in a few rounds.
* ``gemm_efficiency_no_recompute`` of eager Composer (published.COMPOSER_EAGER, llm-foundry's runs
  only), the same for a layout that recomputes nothing: llm-foundry's own table reports a lower
  hardware utilisation for its runs without activation checkpointing (HFU 35-46 % against 48-59 %
  with it, at 4K tokens or fewer); fitted the same way on a row without
  checkpointing that matches the row above in GPUs, sequence and gradient accumulation.  Why Composer's
  eager engine sustains less then, no source says: the constant is measured, not explained.
* ``fp8_efficiency`` of torchao's Float8 training (published.FLOAT8): its fp8 GEMMs with the dynamic
  scaling around each (an amax reduction and a cast of every input, weight and output gradient, in
  kernels of their own) against the fp8 peak times the hardware's factor.  Fitted the same way, on a
  row whose only difference from a calibration row of the same hardware is Float8.
* ``allocator_cache`` of PyTorch's caching allocator (published.PYTORCH): the memory it reserves beyond
  what is allocated, as a share of what is allocated and freed every micro-batch (memory.py's
  "dynamic" terms: activations, gathered weights, logits, buffers, workspace).  The published figure
  is the allocator's peak reserved memory; memory is linear in the share, so one division fits it.
"""
import math
from dataclasses import replace

from hpcpar.tools.plan.memory import STATE_TERMS

GiB = 2**30


def fit_gemm_efficiency(runs, rounds=4, name="gemm_efficiency"):
    """The GEMM efficiency (the Engine field ``name``) that makes ``runs``' predicted step times right
    on geometric average."""
    from hpcpar.tools.plan.validate import predict
    c = 1.0
    for _ in range(rounds):
        logs = []
        for run in runs:
            est = predict(run, engine=replace(run.features["engine"], **{name: c}))
            logs.append(math.log(run.published_step(est.job.model) / est.step))
        c /= math.exp(sum(logs) / len(logs))
    return c


def fit_allocator_cache(runs):
    """The allocator's share that makes ``runs``' predicted peak memory right on average."""
    from hpcpar.tools.plan.validate import predict
    shares = []
    for run in runs:
        est = predict(run, engine=replace(run.features["engine"], allocator_cache=0.0))
        terms = max(est.memory, key=lambda t: sum(t.values()))
        dynamic = sum(v for k, v in terms.items() if k not in STATE_TERMS)
        shares.append((run.memory_gib * GiB - sum(terms.values())) / dynamic)
    return sum(shares) / len(shares)
