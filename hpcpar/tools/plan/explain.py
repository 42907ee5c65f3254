"""The teaching view: every term of a layout's step, with its formula and its numbers.

``explain(estimate)`` returns the text ``hpcpar plan --explain LAYOUT`` prints: the model and its
parameter count, the memory of the fullest stage term by term, the time of one micro-batch on the
slowest stage (GEMMs, element-wise passes, tensor-parallel all-reduces, recomputation), the pipeline
(simulated makespan and bubble next to the textbook formula), the data-parallel gradient traffic and
how much of it shows, the optimizer, and the totals.
"""
from dataclasses import replace

from hpcpar.pipeline.schedules import KINDS
from hpcpar.tools.plan.bubble import TEXTBOOK, analytic_makespan
from hpcpar.tools.plan import experts
from hpcpar.tools.plan.compute import elementwise_bytes, gemm_rate, gemm_seconds, layout_engine_job
from hpcpar.tools.plan.flops import layer_gemms, narayanan_flops, step_flops
from hpcpar.data_parallel.zero_memory import experts_stage
from hpcpar.tools.plan.activations import layer_activation_terms
from hpcpar.tools.plan.memory import stage_params, state_bytes_per_param
from hpcpar.tools.plan.network import (cp_all_to_all_seconds, cp_allgather_seconds, cp_chunk_bytes, cp_ring_crosses_nodes,
                                 cp_ring_seconds, ep_all_to_all_seconds, group_link, members_per_node,
                                 ulysses_message_bytes)

GiB = 2**30


def _ms(seconds):
    return f"{seconds * 1e3:10.2f} ms"


def _gib(nbytes):
    return f"{nbytes / GiB:8.2f} GiB"


def model_section(est):
    job, m = est.job, est.job.model
    lines = [f"MODEL  {m.name}: l={m.layers} h={m.hidden} a={m.heads} kv={m.kv_heads} f={m.ffn} V={m.vocab} "
             f"s={job.seq_len}" + ("  gated MLP" if m.gated else "") + ("" if m.tied else "  untied head"),
             f"  parameters  l * layer + embedding + head = {m.layers} * {m.layer_params():,} + "
             f"{m.embedding_params(job.seq_len):,} + {m.head_params():,} = {m.params(job.seq_len) / 1e9:.2f} B"]
    lines += expert_model_lines(est)
    w, g, o = state_bytes_per_param(job)
    total = m.params(job.seq_len) * (w + g + o)
    lines.append(f"  on one device: {w:g}+{g:g}+{o:g} bytes/param ({job.dtype}, Adam) = {total / GiB:,.0f} GiB of model "
                 f"state alone, vs {job.hardware.memory_bytes / GiB:.0f} GiB per {job.hardware.name} GPU")
    return lines


def expert_model_lines(est):
    """Total against active: the parameters a token multiplies and its FLOPs (hpcpar/shape.py's counts)."""
    job, m = est.job, est.job.model
    if not m.experts:
        return []
    s = job.seq_len
    every = replace(m, top_k=m.experts)          # the same model with every expert active

    def per_token(shape):
        return 3 * (m.layers * shape.block_forward_flops(s) + shape.head_forward_flops())
    return [f"  experts     E={m.experts}, top_k={m.top_k}, shared={m.shared_experts}: routed l * E * MLP = "
            f"{m.layers} * {m.experts} * {m.mlp_params():,} = {m.layers * m.routed_params() / 1e9:.2f} B",
            f"  active      {m.active_params(s) / 1e9:.2f} B of {m.params(s) / 1e9:.2f} B parameters a token goes "
            f"through; training FLOPs per token 3 x forward = {per_token(m) / 1e9:.1f} GFLOP active, "
            f"{per_token(every) / 1e9:.1f} GFLOP were every expert active"]


def _over(lay):
    """The ranks ZeRO shards over, in words: dp*cp, or HSDP's shard group and the groups across."""
    if lay.across == 1:
        return f"dp*cp = {lay.shard}"
    return f"HSDP's dp-shard*cp = {lay.shard}, replicated over {lay.across} groups"


def memory_section(est):
    job, lay = est.job, est.layout
    totals = [sum(t.values()) for t in est.memory]
    i = totals.index(max(totals))
    terms = est.memory[i]
    params = stage_params(job, lay, i)
    w, g, o = state_bytes_per_param(job, lay.zero, lay.shard)
    zero = f" (ZeRO-{lay.zero}: /{lay.shard})" if lay.zero else ""
    act = layer_activation_terms(job, lay)
    dense, routed = experts.split_params(job.model, params, job.stage_layers(lay)[i], lay)
    lines = [f"MEMORY per GPU, fullest stage {i} of {lay.pp} ({job.stage_layers(lay)[i]} layers, "
             f"{(dense + routed) / 1e9:.3f} B parameters on this rank)"]
    if routed:     # the routed experts: E/ep of them, whole over TP, sharded over their own group
        held = experts_stage(lay.zero, lay.shard, lay.ep)
        we, ge, oe = state_bytes_per_param(job, held, lay.expert_shard)
        group = f" (ZeRO-{held}: /{lay.expert_shard})" if held else \
            " (ZeRO's group of one rank: whole)" if lay.zero else ""
        lines.append(f"  dense {dense / 1e9:.3f} B (ZeRO over {_over(lay)}) + routed experts {routed / 1e9:.3f} B "
                     f"(E/ep = {job.model.experts // lay.ep} of each layer's, ZeRO over (dp*cp)/ep = "
                     + (f"{lay.expert_shard})" if lay.across == 1 else
                        f"{lay.replicas // lay.ep}: {lay.expert_shard} of them in a shard group)"))
        for name, a, b, shards in (("weights", w, we, 3), ("gradients", g, ge, 2), ("optimizer state", o, oe, 1)):
            lines.append(f"  {name:18s} {dense / 1e9:.3f} B * {a:.3g} + {routed / 1e9:.3f} B * {b:.3g} bytes"
                         + (group if lay.zero >= shards else "") + f" = {_gib(terms[name])}")
    else:
        lines += [f"  weights            {params / 1e9:.3f} B * {w:.3g} bytes" + (zero if lay.zero >= 3 else "")
                  + f" = {_gib(terms['weights'])}",
                  f"  gradients          {params / 1e9:.3f} B * {g:.3g} bytes" + (zero if lay.zero >= 2 else "")
                  + f" = {_gib(terms['gradients'])}",
                  f"  optimizer state    {params / 1e9:.3f} B * {o:.3g} bytes{zero} = {_gib(terms['optimizer state'])}"]
    lines.append("  activations per layer and micro-batch (Korthikanti et al. 2022, counted tensor by tensor):")
    for name, value in act.items():
        lines.append(f"      {name:34s} {value / 2**20:10.1f} MiB")
    kept = {"none": "all of it", "selective": "without the attention scores",
            "full": "only the layer input (recompute full)"}[lay.recompute]
    lines.append(f"  activations kept: {kept}; {est.pipeline.peak_inflight[i]}"
                 f" chunk(s) of {job.stage_layers(lay)[i] / lay.v:g} layers in flight "
                 f"({lay.schedule}, {'simulated' if est.pipeline.simulated else 'closed-form'} peak"
                 f"{' until W' if KINDS[lay.schedule].split_backward else ''})  = {_gib(terms['activations'])}")
    for name in terms:
        if name not in ("weights", "gradients", "optimizer state", "activations"):
            lines.append(f"  {name:18s}                                  = {_gib(terms[name])}")
    usable = job.hardware.usable_bytes
    lines.append(f"  total {_gib(max(totals))} of {usable / GiB:.1f} GiB usable "
                 f"({job.hardware.memory_bytes / GiB:.0f} GiB - {job.hardware.reserved_bytes / GiB:.1f} reserved): "
                 + ("fits" if est.fits else "DOES NOT FIT"))
    return lines


def compute_section(est):
    lay = est.layout
    job = layout_engine_job(est.job, lay)      # the GEMM efficiency this layout's engine runs at
    hw = job.hardware
    gemms = layer_gemms(job.model, lay.mb, job.seq_len, lay.tp, lay.cp, job.attended)
    lines = [f"COMPUTE one layer, one micro-batch of {lay.mb} x {job.seq_len} tokens, on 1 of tp={lay.tp} ranks",
             f"  GEMM t = max(2mnk / (peak * efficiency(GFLOP) * calibration), bytes / HBM);  peak "
             f"{hw.peak(job.dtype) / 1e12:g} TFLOP/s {job.dtype}, calibration {hw.calibration:g}"
             + (f"; linear layers fp8 at {hw.peak('fp8') / 1e12:g} x {job.engine.fp8_efficiency:g}" if job.engine.fp8
                else "")]
    for g in gemms:
        rate = gemm_rate(job, g)
        lines.append(f"    {g.name:9s} {g.count:>5d} x ({g.m} x {g.k}) @ ({g.k} x {g.n})  {g.flops / 1e9:9.1f} GFLOP "
                     f"at {rate / 1e12:6.1f} TFLOP/s = {_ms(gemm_seconds(job, g))}")
    elem = elementwise_bytes(job, lay)
    lines.append("  element-wise passes (bytes read + written / HBM "
                 f"{hw.hbm_bandwidth / 1e9:.0f} GB/s * efficiency):")
    for name, nbytes in elem.items():
        lines.append(f"    {name:18s} {nbytes / 2**20:10.1f} MiB = {_ms(hw.memory_seconds(nbytes))}")
    link = group_link(hw, lay, "tp", job.gpus_per_node)
    nbytes = job.seq_len * lay.mb * job.model.hidden * job.elem_bytes
    lines.append(f"  TP all-reduce of b*s*h = {nbytes / 2**20:.1f} MiB over {lay.tp} ranks: 2(t-1)*alpha + "
                 f"2(t-1)/t * n / beta, beta = {link.bandwidth * link.efficiency / 1e9:.0f} GB/s; 2 forward, 2 backward"
                 + ("; with sp an all-gather + reduce-scatter pair each, same time" if lay.sp else ""))
    if lay.cp > 1 and lay.cp_kind == "ulysses":
        qkv, o = ulysses_message_bytes(job, lay)
        lines.append(f"  CP Ulysses: all-to-alls over {lay.cp} ranks of Q, K, V ({qkv / 2**20:.1f} MiB a rank) and O "
                     f"({o / 2**20:.1f} MiB), (cp-1)/cp of each leaving the rank: "
                     f"{_ms(cp_all_to_all_seconds(job, lay)).strip()} forward, the same backward (dO; dQ, dK, dV); "
                     "exposed, around the attention core")
    elif lay.cp > 1 and job.engine.cp_allgather:
        lines.append(f"  CP all-gather of {lay.cp} K and V chunks of {cp_chunk_bytes(job, lay) / 2**20:.1f} MiB over "
                     f"{lay.cp} ranks: {_ms(cp_allgather_seconds(job, lay)).strip()} forward, twice backward "
                     "(K, V gathered again, dK, dV reduce-scattered); exposed, before the attention core")
    elif lay.cp > 1:
        crosses = cp_ring_crosses_nodes(job, lay)
        ring = cp_ring_seconds(job, lay)
        lines.append(f"  CP ring: cp-1 = {lay.cp - 1} hops of one K and V chunk, {cp_chunk_bytes(job, lay) / 2**20:.1f} "
                     f"MiB, over {'the network (the ring spans nodes)' if crosses else 'NVLink (inside a node)'}: "
                     f"{_ms(ring).strip()} forward; backward K and V again and cp = {lay.cp} hops of dK, dV "
                     "(3cp-2 hops in all); hidden under the attention core up to its length, but for the "
                     "last dK, dV hop")
    return lines + ep_lines(job, lay)


def ep_lines(job, lay):
    """The expert-parallel all-to-alls of one layer (none without ep)."""
    if lay.ep == 1:
        return []
    nbytes = experts.dispatch_bytes(job.model, lay, job.seq_len // lay.cp * lay.mb, job.elem_bytes)
    local = members_per_node(lay, "ep", job.gpus_per_node)[1]
    one = ep_all_to_all_seconds(job, lay, nbytes)
    return [f"  EP all-to-all of tokens * top_k * h = {nbytes / 2**20:.1f} MiB a rank over ep = {lay.ep} ranks, {local} "
            f"on a node: (ep-1)*alpha + max((k-1)/ep * n / NVLink, (ep-k)/ep * n / port) = {_ms(one).strip()}; "
            "dispatch + combine forward, the same two backward; exposed"]


def stage_section(est):
    lay = est.layout
    slow = max(range(lay.pp), key=lambda i: est.stages[i].forward + est.stages[i].backward + est.stages[i].weight)
    st = est.stages[slow]
    lines = [f"STAGE {slow} (the slowest; the pipeline moves at its pace), per micro-batch:"]
    for name, value in st.terms.items():
        lines.append(f"    {name:22s} {_ms(value)}")
    lines.append(f"  F = {_ms(st.forward).strip()}   B (input grads{', + recompute' if lay.recompute != 'none' else ''}) = "
                 f"{_ms(st.backward).strip()}   W (weight grads) = {_ms(st.weight).strip()}"
                 + (f"   per chunk: /{lay.v}" if lay.v > 1 else ""))
    return lines


def pipeline_section(est):
    job, lay, pipe = est.job, est.layout, est.pipeline
    m = job.micro_batches(lay)
    F, B, W = est.costs
    formula, source = TEXTBOOK.get(lay.schedule, ("(p-1)/(v*m)", "Narayanan et al. 2021"))
    textbook = analytic_makespan(lay.schedule, lay.pp, m, lay.v, F, B, W, 0.0) / (m * lay.v * (F + B + W)) - 1
    sims = " and ".join(str(x) for x in pipe.simulated)
    return [f"PIPELINE {lay.schedule}, p={lay.pp}, m={m} micro-batches, v={lay.v}",
            f"  p2p: one activation {'(1/t with sp or scatter/gather) ' if lay.sp or job.engine.scatter_gather_p2p else ''}"
            f"= {_ms(est.p2p).strip()} (alpha + n/beta)",
            f"  simulated (hpcpar.pipeline.simulate, m = {sims}, extrapolated linearly in m): makespan "
            f"{pipe.makespan:.3f} s, bubble {pipe.bubble:.1%}",
            f"  textbook bubble {formula} of the ideal time = {textbook:.1%} ({source})"]


def totals_section(est):
    job, lay = est.job, est.layout
    experts_over = f" (the routed experts' over (dp*cp)/ep={lay.replicas // lay.ep})" if lay.ep > 1 else ""
    how = "reduce-scatter + all-gather" if lay.across == 1 else \
        f"reduce-scatter over {lay.shard} + all-reduce of 1/{lay.shard} across {lay.across} groups + all-gather"
    lines = [f"DATA PARALLEL gradients over dp*cp={lay.replicas}{experts_over}: {how} = "
             f"{_ms(est.dp_total).strip()}, exposed {_ms(est.dp_exposed).strip()}"
             + (" (overlapped with the last micro-batch's backward, in buckets)" if job.engine.overlap_dp else "")]
    if lay.zero >= 3:
        lines.append(f"FSDP per micro-batch 2 all-gathers of the weights + 1 reduce-scatter of the gradients: "
                     f"{_ms(est.fsdp[0]).strip()} in the step, {_ms(est.fsdp[1]).strip()} exposed (in F and B)")
    muon = f" + Muon's Newton-Schulz and its {job.engine.muon_tp} TP messages" if job.engine.optimizer == "muon" else ""
    lines += [f"OPTIMIZER read + write of every state byte on the rank{muon} = {_ms(est.optimizer).strip()}",
              f"STEP {est.step:.3f} s = pipeline {est.pipeline.makespan:.3f} + DP {est.dp_exposed:.3f} + optimizer "
              f"{est.optimizer:.3f};  communication {est.comm / est.step:.1%} of the step",
              f"  {est.tokens_per_second:,.0f} tokens/s, {est.tokens_per_second / job.gpus:,.0f} per GPU"]
    model = step_flops(job.model, job.global_batch, job.seq_len, keys=job.attended)
    lines.append(f"  model FLOPs/step {model:.3e} (72*B*s*l*h^2*(1 + s/6h + V/12lh) for a GPT: "
                 f"{narayanan_flops(job.global_batch, job.seq_len, job.model.layers, job.model.hidden, job.model.vocab):.3e})")
    lines.append(f"  MFU {est.mfu:.1%}, HFU (recomputed FLOPs counted) {est.hfu:.1%}, "
                 f"{est.mfu * job.hardware.peak(job.dtype) / 1e12:.0f} model TFLOP/s per GPU")
    return lines


def explain(est):
    sections = [model_section, memory_section, compute_section, stage_section, pipeline_section, totals_section]
    head = [f"LAYOUT {est.layout}  on {est.job.gpus} x {est.job.hardware.name} "
            f"({est.job.gpus_per_node} per node), global batch {est.job.global_batch} x {est.job.seq_len}"]
    return "\n\n".join("\n".join(s) for s in [head] + [section(est) for section in sections])
