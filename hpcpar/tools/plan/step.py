"""One training step, every term: the planner's model of a layout on a job.

    step = pipeline makespan (simulated, with p2p latency)  +  exposed DP gradient traffic
           + optimizer update

* Pipeline: each stage's F, B, W per micro-batch (compute.py); the simulator runs the schedule with
  the slowest stage's costs (a pipeline moves at its slowest stage) divided by v per chunk.
* DP: reduce-scatter + all-gather of the gradients over the DP group (network.py).  hpcpar's engine
  starts each bucket's all-reduce as soon as its gradients are final, i.e. during the *last*
  micro-batch's backward (earlier micro-batches only accumulate): that backward hides the traffic
  up to its own length, and the last bucket always shows.  Stage i finishes its pipeline about
  i * (B + W) before stage 0, which hides more.  With ZeRO-1/2 the all-gather of the updated
  parameters follows the optimizer step and is never hidden.  The group is the dp * cp ranks that
  hold the same weights.
* ZeRO-3 / FSDP instead gathers every unit's weights before its forward and again before its
  backward, and reduce-scatters its gradients after it, every micro-batch: 2 all-gathers of the
  16-bit weights + 1 reduce-scatter of the gradients per micro-batch, prefetched under that
  micro-batch's F + B + W; what does not fit under it, and always the first unit's gather, shows.
  An engine that gathers a pipeline stage once per step pays one all-gather (exposed) and one
  reduce-scatter (hidden like the DP gradients) per step instead.
* Optimizer: a memory-bound pass reading and writing every state byte this rank holds; with Muon, its
  Newton-Schulz iterations at the GEMM rate and their tensor-parallel messages on the rank with the most
  blocks (the FLOPs and bytes the engine counts: tensor_parallel/muon.muon_costs).

MFU = model FLOPs (no recomputation) / (step * GPUs * peak); HFU counts the recomputed FLOPs too.
"""
from dataclasses import dataclass
from functools import cached_property

from hpcpar.data_parallel.zero_memory import gathered_number_bytes
from hpcpar.tools.plan import experts
from hpcpar.tools.plan.bubble import PipelineResult, analytic_makespan, simulate_pipeline
from hpcpar.tools.plan.compute import layer_key, layer_times, stage_times, tp_comm_seconds
from hpcpar.tools.plan.flops import step_flops
from hpcpar.tools.plan.layout import by_class
from hpcpar.tools.plan.memory import (ALLOCATOR_CACHE, STATE_TERMS, analytic_inflight, keeps_stage_gathered,
                                      layout_memory, number_bytes, stage_memory, stage_params, state_bytes_per_param)
from hpcpar.tools.plan.network import (across_seconds, all_reduce_seconds, dp_gradient_seconds, group_link,
                                       p2p_seconds, reduce_scatter_seconds, shard_seconds)
from hpcpar.tensor_parallel.muon import muon_costs


@dataclass
class Estimate:
    job: object
    layout: object
    stages: list               # StageTimes per stage
    costs: tuple               # (F, B, W) per chunk of the slowest stage, seconds
    p2p: float                 # one activation message between stages, seconds
    pipeline: object           # PipelineResult (or the analytic makespan, bubble, peak)
    memory: list               # per stage, {term: bytes}
    dp_total: float            # DP gradient traffic of the critical stage, seconds
    dp_exposed: float          # the part of it the step waits for
    optimizer: float
    comm_off_pipeline: float   # seconds of communication outside the p2p messages (TP, CP, DP, FSDP)
    step: float
    fsdp: tuple = (0.0, 0.0)   # ZeRO-3 traffic of the step (total, exposed): inside the pipeline's F, B

    @cached_property
    def p2p_delay(self):
        """What the p2p latency adds to the pipeline: the simulated makespan without it, subtracted
        (simulated only when asked: the search ranks by step time, and the table shows a few)."""
        lay, (F, B, W) = self.layout, self.costs
        if not self.pipeline.simulated:
            return 2 * (lay.pp - 1) * self.p2p
        m = self.job.micro_batches(lay)
        return self.pipeline.makespan - simulate_pipeline(lay.schedule, lay.pp, m, lay.v, F, B, W, 0.0).makespan

    @property
    def comm(self):
        """Seconds of the step spent in communication (TP, CP, p2p, DP, FSDP)."""
        return self.comm_off_pipeline + max(self.p2p_delay, 0.0)

    @property
    def memory_peak(self):
        return max(sum(t.values()) for t in self.memory)

    @property
    def fits(self):
        """Whether the allocated peak fits: a caching allocator gives its cache back before failing."""
        allocated = max(sum(v for k, v in t.items() if k != ALLOCATOR_CACHE) for t in self.memory)
        return allocated <= self.job.hardware.usable_bytes

    @property
    def tokens_per_second(self):
        return self.job.global_batch * self.job.seq_len / self.step

    def utilisation(self, recompute="none"):
        """MFU with the default, HFU with the layout's recomputation."""
        job = self.job
        flops = step_flops(job.model, job.global_batch, job.seq_len, recompute, job.attended)
        return flops / (self.step * job.gpus * job.hardware.peak(job.dtype))

    @property
    def mfu(self):
        return self.utilisation()

    @property
    def hfu(self):
        return self.utilisation(self.layout.recompute)


def dp_exposure(job, layout, stages):
    """(total, exposed) seconds of DP gradient traffic, the worst stage."""
    worst = (0.0, 0.0)
    once = layout.zero >= 3 and keeps_stage_gathered(job, layout)
    if layout.replicas == 1 or (layout.zero >= 3 and not once and layout.across == 1):
        return worst
    grad_bytes = state_bytes_per_param(job)[1]
    traffic = by_class(job.stage_classes(layout), lambda i: gradient_traffic(job, layout, i, grad_bytes, once))
    for i, (st, (rs, ag, nbytes)) in enumerate(zip(stages, traffic)):
        total = rs + ag
        hideable = rs if layout.zero else total
        if job.engine.overlap_dp:
            window = (st.backward + st.weight) / layout.v + i * (st.backward + st.weight)
            last_bucket = hideable * min(1.0, job.engine.bucket_bytes / nbytes)
            shown = max(hideable - window, last_bucket)
        else:
            shown = hideable
        exposed = shown + (ag if layout.zero else 0.0)
        worst = max(worst, (total, exposed), key=lambda te: te[1])
    return worst


def gradient_traffic(job, layout, stage, grad_bytes, once):
    """(reduce-scatter, all-gather) seconds of one rank of ``stage`` averaging its gradients of
    ``grad_bytes`` a number, and their bytes; ``once``: ZeRO-3 gathering the stage once per step."""
    # a mixture of experts' routed experts are summed over their own expert-data group
    dense, routed = experts.split_params(job.model, stage_params(job, layout, stage),
                                         job.stage_layers(layout)[stage], layout)
    if layout.zero >= 3 and not once:     # the reduce-scatters run in the pipeline (fsdp_exposure): here
        #                                   HSDP's all-reduce across the shard groups, once a step
        rs = across_seconds(job, layout, dense * grad_bytes)
        rs += experts.gradient_across_seconds(job, layout, routed, grad_bytes) if routed else 0.0
        return rs, 0.0, (dense + routed) * grad_bytes
    rs, ag = dp_gradient_seconds(job, layout, dense * grad_bytes)
    if routed:
        ers, eag = experts.gradient_seconds(job, layout, routed, grad_bytes)
        rs, ag = rs + ers, ag + eag
    if once:   # the stage's 16-bit weights gathered at the start of the step
        ag = dp_gradient_seconds(job, layout, stage_params(job, layout, stage) * job.elem_bytes)[1]
    return rs, ag, (dense + routed) * grad_bytes


def fsdp_exposure(job, layout, params, layers, compute):
    """(total, exposed) seconds of one micro-batch's ZeRO-3 traffic on a stage of ``params``
    parameters in ``layers`` blocks whose F + B + W take ``compute`` seconds: two all-gathers of the
    weights and a reduce-scatter of the gradients, the routed experts' over their expert-data group."""
    if layout.zero < 3 or keeps_stage_gathered(job, layout):
        return 0.0, 0.0
    grads = state_bytes_per_param(job)[1]
    dense, routed = experts.split_params(job.model, params, layers, layout)
    gathered = job.elem_bytes if not job.engine.fp8_param_gather else \
        gathered_number_bytes(job.elem_bytes, layers * job.model.quantised_params() / layout.tp / dense)
    total = 2 * shard_seconds(job, layout, dense * gathered) + shard_seconds(job, layout, dense * grads)
    if routed:                  # [1]: one reduce-scatter or all-gather over the experts' shard group alone
        total += 2 * experts.gradient_seconds(job, layout, routed, job.elem_bytes)[1] \
            + experts.gradient_seconds(job, layout, routed, grads)[1]
    first_unit = total * job.model.gathered_block_params(layout.tp, layout.ep, layout.shard) / (dense + routed)
    return total, max(total - compute, first_unit)


def stage_times_all(job, layout, shared):
    """StageTimes of every stage: alike stages (Job.stage_classes) share one, and so do the layouts
    alike in a layer's times (compute.layer_key) that keep the same ``shared`` dict."""
    layer = layer_key(layout)
    if layer not in shared:
        shared[layer] = layer_times(job, layout)
    return by_class([(layer, key) for key in job.stage_classes(layout)],
                    lambda i: stage_times(job, layout, i, shared[layer]), shared)


def estimate(job, layout, simulate=True, per_search=None):
    """The model of one step of ``layout`` on ``job`` (see the module docstring); ``per_search``: a
    dict kept across the layouts of one job (the search's), in which the times of a layer and of a
    stage are worked out once."""
    lay, m = layout, job.micro_batches(layout)
    stages = stage_times_all(job, lay, {} if per_search is None else per_search)
    F = max(s.forward for s in stages) / lay.v
    B = max(s.backward for s in stages) / lay.v
    W = max(s.weight for s in stages) / lay.v
    classes = job.stage_classes(lay)
    held = by_class(classes, lambda i: stage_params(job, lay, i))
    fullest = max(range(lay.pp), key=held.__getitem__)
    params = held[fullest]
    fsdp_total, fsdp_shown = fsdp_exposure(job, lay, params, job.stage_layers(lay)[fullest], (F + B + W) * lay.v)
    F, B = F + fsdp_shown / (2 * lay.v), B + fsdp_shown / (2 * lay.v)
    split = lay.tp if (lay.sp or job.engine.scatter_gather_p2p) else 1
    p2p = p2p_seconds(job, lay, job.seq_len // lay.cp * lay.mb * job.model.hidden * job.elem_bytes / split)
    if not job.engine.overlap_p2p and lay.pp > 1:   # blocking transfers: the stage pays each one
        F, B = F + p2p, B + p2p
    if simulate:
        pipe = simulate_pipeline(lay.schedule, lay.pp, m, lay.v, F, B, W, p2p)
    else:
        t = analytic_makespan(lay.schedule, lay.pp, m, lay.v, F, B, W, p2p)
        peak = [analytic_inflight(lay.schedule, lay.pp, m, lay.v, i) for i in range(lay.pp)]
        pipe = PipelineResult(t, 1 - m * lay.v * (F + B + W) / t, tuple(peak), ())
    shared = layout_memory(job, lay)
    # stages of one class holding as many in flight have the same terms; each stage gets its own dict
    alike = by_class(list(zip(classes, pipe.peak_inflight)),
                     lambda i: stage_memory(job, lay, i, pipe.peak_inflight[i], shared))
    memory = [dict(terms) for terms in alike]
    grad_total, grad_exposed = dp_exposure(job, lay, stages)
    optimizer = job.hardware.memory_seconds(2 * max(sum(t[k] for k in STATE_TERMS) for t in memory)) \
        + muon_seconds(job, lay)
    tp_comm = max(map(tp_comm_seconds, stages)) * m
    step = pipe.makespan + grad_exposed + optimizer       # the FSDP part is inside the pipeline's F and B
    return Estimate(job, lay, stages, (F, B, W), p2p, pipe, memory, grad_total, grad_exposed, optimizer,
                    comm_off_pipeline=tp_comm + grad_exposed + fsdp_shown * m, step=step,
                    fsdp=(fsdp_total * m, fsdp_shown * m))


def muon_seconds(job, layout):
    """Muon's Newton-Schulz on the rank with the most blocks, at the GEMM rate of one of its products,
    and its messages over TP: one all-gather a slice (duplicated), or ns_steps + 1 all-reduces a slice
    (distributed), a slice a bucket of the stage's weights; under ZeRO a rank's mean share, each matrix on
    its owner; 0 for another optimizer."""
    e = job.engine
    if e.optimizer != "muon":
        return 0.0
    blocks = max(job.stage_layers(layout))
    master = number_bytes(job)["master"]
    owners = (layout.shard, max(1, layout.shard // layout.ep)) if layout.zero else (1, 1)   # ZeRO: whole on owners
    flops, sent = muon_costs(job.model, blocks, layout.tp, layout.ep, e.muon_tp, e.ns_steps, master, owners=owners)
    dtype = e.ns_dtype or {4: "fp32", 8: "fp64"}[master]
    h = job.model.hidden
    seconds = flops / job.hardware.gemm_rate(2 * h * h * h, dtype) if flops else 0.0     # a (h, h) product's rate
    if not sent:
        return seconds
    link = group_link(job.hardware, layout, "tp", job.gpus_per_node)
    slices = max(1, -(-blocks * job.model.layer_params() / layout.tp * master // e.bucket_bytes))
    if e.muon_tp == "duplicated":
        return seconds + reduce_scatter_seconds(link, layout.tp, sent * layout.tp) \
            + (slices - 1) * (layout.tp - 1) * link.latency
    calls = slices * (e.ns_steps + 1)
    return seconds + all_reduce_seconds(link, layout.tp, sent) + (calls - 1) * 2 * (layout.tp - 1) * link.latency
