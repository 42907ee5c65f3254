"""The end-of-run summary of ``hpcpar train``: the numbers a user needs, side by side.

The loss against the data's entropy floor, tokens per second, model FLOPs utilisation against the
GEMM rate measured on these very ranks, the measured pipeline bubble against the simulator's
prediction for the measured F/B/W times, the bytes each kind of group moved, the BLAS threads each
rank runs (chosen by launch.choose_threads), and - when the ranks ran on more than one host - which of
those bytes crossed between the hosts (placement.describe_boundary).  Every rank hands its records
(loop.py) to rank 0 once, at the end; rank 0 prints the summary and writes --summary-json.
"""
import json
import socket
import statistics

from hpcpar import blas, launch
from hpcpar.pipeline.bubble import mean_costs, pipeline_bubble, simulated_bubble
from hpcpar.comm.placement import describe_boundary, world_ranks

# the communicators, in the order shown (HSDP's shard groups and the groups across: data_parallel/protocol.py)
GROUPS = ("tp", "cp", "pp", "dp", "dp_cp", "dp_shard", "dp_across", "dp_cp_shard", "dp_cp_across", "ep", "edp",
          "edp_shard", "edp_across", "embed", "world")


def summarize(loop, peak):
    """Collective over the world: gather every rank's figures; on rank 0 print them and return them as
    a dict (None elsewhere, or when no step ran).  ``peak``: the GEMM rate of all ranks together."""
    cfg, t, g = loop.cfg, loop.trainer, loop.grid
    steps = max(1, len(loop.history) - 1)
    n = max(1, len(loop.history))
    volume = {c.name: c.stats.total_bytes() / n for c in t.communicators()}
    blocked = {c.name: c.stats.total_seconds() / n for c in t.communicators()}
    mine = {"windows": loop.windows, "volume": volume, "blocked": blocked,
            "costs": mean_costs(loop.timelines), "host": socket.gethostname(),
            "members": {c.name: world_ranks(c.mpi, g.world_comm.mpi) for c in g.communicators()}}
    everyone = g.world_comm.mpi.gather(mine, root=0)       # once per run: a pickled gather is fine
    if not loop.root or not loop.history:
        return None
    times = [h[4] for h in loop.history[1:]] or [loop.history[0][4]]
    step_time = statistics.median(times)
    loss = loop.history[-1][1]
    docs = t.doc_figures                                   # --documents: attention within each (documents.py)
    flops = t.kind.step_flops(t.mcfg, cfg, t.tokens_per_step, docs and docs.mean_span())
    groups = {}
    for r in everyone:
        for name, b in r["volume"].items():
            groups[name] = groups.get(name, 0.0) + b
    costs = {op: statistics.fmean(r["costs"][op] for r in everyone) for op in ("F", "B", "W")}
    blocked = {name: statistics.fmean(r["blocked"].get(name, 0.0) for r in everyone) for name in groups}
    measured = pipeline_bubble([w for r in everyone for w in r["windows"]])
    simulated = simulated_bubble(t.schedule, costs)
    floor = getattr(t.data, "entropy_floor", None)
    n_params = sum(p.data.size for p in t.parameters())
    lines = [
        f"hpcpar train: {len(loop.history)} steps"
        + (f" (steps {loop.history[0][0] + 1}-{loop.history[-1][0] + 1})" if loop.history[0][0] else "")
        + f", {cfg.model} model, tp {cfg.tp} x " + (f"cp {cfg.cp} x " if cfg.cp > 1 else "")
        + f"pp {cfg.pp} x dp {cfg.dp} " + (f"(ep {cfg.ep}) " if cfg.ep > 1 else "")
        + f"= {g.world} ranks, {cfg.schedule} with {cfg.microbatches} micro-batch"
        + ("es" if cfg.microbatches > 1 else "")
        + (f" x {cfg.chunks} chunks" if cfg.chunks > 1 else "") + f", {cfg.dtype}"
        + (f" masters, {cfg.precision} compute" if cfg.precision != "fp32" else ""),
        f"  loss        {loss:.6g}" + (f"   (entropy floor {floor:.6g}: {100 * (loss / floor - 1):+.1f}%)"
                                       if floor else ""),
        f"  throughput  {t.tokens_per_step / step_time:,.0f} tokens/s, {step_time * 1e3:.1f} ms/step (median)",
        f"  MFU         {100 * flops / step_time / peak:.1f}% of the GEMM rate measured on these {g.world} ranks "
        f"({peak / 1e9:.1f} GFLOP/s together; {flops / 1e9:.2f} GFLOP per step)",
        f"  bubble      measured {100 * measured:.1f}% of pipeline time idle; simulated "
        f"{100 * simulated:.1f}% for the measured F {costs['F'] * 1e3:.2f} ms, "
        f"B {costs['B'] * 1e3:.2f} ms, W {costs['W'] * 1e3:.2f} ms",
        "  bytes/step  " + (", ".join(f"{name} {_size(groups[name])}" for name in GROUPS if groups.get(name))
                            or "none: a single rank communicates with nobody")
        + (" (payload handed to MPI, all ranks)" if g.world > 1 else ""),
        *(["  comm time   " + ", ".join(f"{name} {1e3 * sec:.1f} ms" for name, sec in blocked.items() if sec)
           + f" per step and rank inside MPI calls ({100 * sum(blocked.values()) / step_time:.0f}% of the step)"]
          if g.world > 1 else []),
        *describe_boundary([r["host"] for r in everyone], [r["members"] for r in everyone],
                           [r["volume"] for r in everyone], _size),
        *([docs.line()] if docs else []),
        f"  parameters  {n_params:,} on rank 0 of this layout",
        *([_experts_line(t.experts)] if t.experts else []),
        f"  threads     {_threads()}",
        f"  gemm        {_gemm(cfg)}",
        *_recoveries(loop),
    ]
    loop._print("\n".join(lines))
    figures = {"loss": loss, "entropy_floor": floor, "step_time_s": step_time,
               "tokens_per_s": t.tokens_per_step / step_time, "mfu": flops / step_time / peak,
               "gemm_flops_per_s": peak, "model_flops_per_step": flops,
               "bubble_measured": measured, "bubble_simulated": simulated,
               "costs_s": costs, "bytes_per_step": groups, "comm_seconds_per_step": blocked,
               "steps": steps, "gemm": "cupy" if cfg.backend == "cupy" else blas.provider().name,
               "layout": {"tp": cfg.tp, "cp": cfg.cp, "pp": cfg.pp, "dp": cfg.dp, "world": g.world,
                          "chunks": cfg.chunks, "schedule": cfg.schedule, "microbatches": cfg.microbatches},
               "tokens_per_step": t.tokens_per_step, "step_times_s": times}
    if t.experts:
        figures["experts"] = t.experts
    if loop.recovery is not None:
        figures["recoveries"] = loop.recovery.records
        if loop.recovery.copies is not None:
            figures["copies"] = loop.recovery.copies.figures()
    if cfg.summary_json:
        with open(cfg.summary_json, "w") as f:
            json.dump(figures, f, indent=1)
    return figures


def _recoveries(loop):
    """--on-failure shrink: a line per failure the job went on after (training/recovery.py)."""
    lines = []
    for r in loop.recovery.records if loop.recovery is not None else ():
        lay = r["layout"]
        first = r.get("seconds_to_first_step")
        lines.append(f"  recovered   {', '.join(r['ranks'])} gone after step {r['step']}: tp {lay['tp']} x pp "
                     f"{lay['pp']} x dp {lay['dp']} on {lay['world']} ranks from {r['source']} (step {r['from_step']}), "
                     f"{r['replayed']} replayed" + (f", first new step {first:.2f} s after the failure" if first else ""))
    return lines


def _experts_line(e):
    """The last step's routing (expert_load.py)."""
    return (f"  experts     last step: {e['load_min']} to {e['load_max']} choices per expert (even share "
            f"{e['load_mean']:.0f}), {e['effective_experts']:.2f} effective experts in the least balanced layer, "
            f"{e['dropped']} dropped" + (f", aux loss {e['aux_loss']:.4g}" if e["aux_loss"] else ""))


def _gemm(cfg):
    """Which library ran the GEMMs (hpcpar/blas), and why."""
    return "cupy (cuBLAS on the GPU)" if cfg.backend == "cupy" else blas.summary()


def _threads():
    count, why = launch.threads or ("?", "not chosen by hpcpar")
    return f"{count} BLAS/OpenMP thread{'' if count == 1 else 's'} per rank ({why})"


def _size(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
