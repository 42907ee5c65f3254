"""Plan a training job before submitting it: memory and time of every layout, ranked.

  hpcpar plan --model gpt3-175b --gpus 1024 --gpus-per-node 8 --hardware a100 \\
              --global-batch 1536 --seq-len 2048 [--top 10] [--explain top] [--plot plan.png]
              [--tp 8] [--pp N] [--cp 16 [--cp-kind ring|ulysses]] [--ep 8] [--zero 1|2|3]
              [--recompute none|selective|full] [--schedule gpipe|1f1b|interleaved|zb-h1|zb-h2|zb-v|dualpipev]
              [--overlap-tp | --no-overlap-tp] [--fp8] [--fp8-param-gather] [--cp-allgather]
              [--intra-gbps 450 --inter-gbps 50 --memory-gib 80]
  hpcpar plan --validate [MATCH]               predicted vs published runs (hpcpar/tools/plan/runs/*.toml)
  hpcpar plan calibrate [--out local.toml]      measure this machine into a hardware profile
  hpcpar plan local --hardware local.toml --model small --dtype fp32 --global-batch 16 [--tp 2]
              [--pp 2 --microbatches 4] [--dp 2] [--cp 2] [--recompute selective] [--zero 1]
                                                every term of one hpcpar train step on this machine

--model: gpt2, gpt3-175b, llama-70b, ... (the files in hpcpar/tools/plan/models), a .toml file, or dims such
as l=24,h=2048,a=16,V=50257[,kv=8,f=5632,gated=1,tied=0].  --hardware: a100, h100, h200, h800 or a profile
.toml (e.g. from `hpcpar plan calibrate`).  A LAYOUT is written tp8-pp8-dp16-mb1-v1-1f1b[-cp2[-ulysses]]
[-ep8][-sp][-z1|-z2|-z3][-rcsel|-rcfull]: tensor, pipeline and data parallel sizes, micro-batch size,
chunks per stage, schedule (gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, dualpipev), sequence
parallelism, context parallelism, expert parallelism (-ep8), ZeRO stage (z3: FSDP), selective or full
recomputation.  --tp/--pp/--dp/--cp/--ep/--zero/--recompute/--schedule pin that part of the layout and
the search ranks the rest.  The model behind the
numbers: docs/planning.md.
"""
import argparse

from hpcpar.cli import finite

MAX_GPUS = 2 ** 20      # the largest job planned (the search itself takes seconds at this size)

HELP = "rank layouts of a training job by predicted step time and memory (no MPI)"


def add_arguments(p):
    p.add_argument("action", nargs="?", choices=["calibrate", "local"],
                   help="calibrate: measure this machine; local: explain an hpcpar train step on it")
    p.add_argument("--model", help="preset name, model .toml, or dims l=..,h=..,a=..,V=..")
    p.add_argument("--gpus", type=int, help="GPUs (ranks) in the job")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the hardware profile's)")
    p.add_argument("--hardware", default="a100", help="a100, h100, h200, h800 or a profile .toml (default a100)")
    p.add_argument("--global-batch", type=int, help="sequences per step")
    p.add_argument("--seq-len", type=int, help="tokens per sequence")
    p.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32", "fp64"],
                   help="training precision (default bf16, or fp32 for a profile without bf16)")
    p.add_argument("--flash-attention", action="store_true", help="the engine fuses attention")
    p.add_argument("--overlap-tp", action=argparse.BooleanOptionalAction, default=False,
                   help="TP collectives overlapped with the GEMMs (--no-overlap-tp: exposed, the default)")
    p.add_argument("--fp8", action="store_true", help="linear-layer GEMMs in fp8 (needs an fp8 peak)")
    p.add_argument("--fp8-param-gather", action="store_true",
                   help="ZeRO-3 gathers the quantised weights as FP8 codes, one byte a number")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], help="pin the ZeRO stage (3: FSDP)")
    p.add_argument("--dp-shard", type=int, metavar="N",
                   help="pin HSDP: ZeRO over groups of N dp ranks, replicated across them (0: over every dp rank; "
                        "default: on several nodes both tried, the groups filling part of a node)")
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "muon"],
                   help="muon: one momentum for the blocks' matrices, Newton-Schulz and its TP messages in the step")
    p.add_argument("--muon-tp", default="duplicated", choices=["duplicated", "distributed", "blockwise"],
                   help="Muon's tensor-parallel mode (hpcpar train's --muon-tp)")
    p.add_argument("--recompute", choices=["none", "selective", "full"], help="pin the recomputation")
    p.add_argument("--cp", type=int, default=1, help="context-parallel size (default 1)")
    p.add_argument("--ep", type=int, default=0,
                   help="pin the expert-parallel size (a model with experts; default: every ep dividing dp*cp and "
                        "the experts is tried)")
    p.add_argument("--cp-kind", choices=["ring", "ulysses"],
                   help="pin how the cp ranks attend: ring, or ulysses (all-to-alls around attention; the heads "
                        "per tp rank must divide by cp); default: both tried when --cp > 1")
    p.add_argument("--doc-len", type=int, default=0,
                   help="sequences packed with documents of this many tokens, attention within each (hpcpar train "
                        "--documents): the attention core computes their squares, not the sequence's")
    p.add_argument("--window", type=int, default=0, help="sliding-window attention: each query sees at most this "
                                                         "many keys (hpcpar train --window)")
    p.add_argument("--cp-allgather", action="store_true",
                   help="context parallelism all-gathers K and V before attention, exposed (Llama 3's), "
                        "instead of a ring overlapped with it")
    for flag, what in (("intra-gbps", "NVLink bandwidth per GPU, one direction, GB/s"),
                       ("inter-gbps", "network bandwidth per GPU, GB/s"), ("memory-gib", "memory per GPU, GiB"),
                       ("hbm-gbps", "memory bandwidth, GB/s")):
        p.add_argument(f"--{flag}", type=finite, help=f"override the hardware profile's {what}")
    p.add_argument("--validate", nargs="?", const="", metavar="MATCH",
                   help="predicted vs published throughput and memory of the published runs (those whose "
                        "name contains MATCH)")
    p.add_argument("--top", type=int, default=10, help="layouts to list (default 10)")
    p.add_argument("--explain", metavar="LAYOUT", help="print every term of one layout ('top': the best)")
    p.add_argument("--plot", metavar="PNG", help="draw memory and time of the listed layouts")
    p.add_argument("--out", default="local.toml", help="calibrate: where to write the profile")
    for flag in ("tp", "pp", "dp"):
        p.add_argument(f"--{flag}", type=int, default=0, help=f"pin the {flag} size (local: hpcpar train's --{flag})")
    for flag in ("microbatches", "chunks"):
        p.add_argument(f"--{flag}", type=int, default=0, help=f"local: hpcpar train's --{flag}")
    p.add_argument("--schedule", help="pin the pipeline schedule (gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, "
                                      "dualpipev); local: hpcpar train's --schedule (default 1f1b)")


def _job(args):
    from hpcpar.tools.plan.hardware import load_hardware
    from hpcpar.tools.plan.flops import packed_keys
    from hpcpar.tools.plan.job import Engine, Job
    from hpcpar.tools.plan.models import load_model
    from hpcpar.runtime import UsageError
    missing = [f"--{n.replace('_', '-')}" for n in ("model", "gpus", "global_batch", "seq_len")
               if getattr(args, n) is None]
    if missing:
        raise UsageError(f"hpcpar plan needs {', '.join(missing)} (or the calibrate action)")
    for name in ("gpus", "global_batch", "seq_len", "top"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer")
    if args.gpus > MAX_GPUS:
        raise UsageError(f"--gpus {args.gpus:,}: the planner takes jobs of at most {MAX_GPUS:,} GPUs")
    hw = with_overrides(load_hardware(args.hardware), args)
    gpn = args.gpus_per_node or hw.gpus_per_node
    if gpn < 1:
        raise UsageError("--gpus-per-node must be a positive integer")
    dtype = args.dtype or ("bf16" if "bf16" in hw.peak_flops else "fp32")
    hw.peak(dtype)     # refuses a dtype the profile has no rate for
    return Job(load_model(args.model), hw, args.gpus, min(gpn, args.gpus), args.global_batch, args.seq_len,
               dtype=dtype, engine=Engine(flash_attention=args.flash_attention, overlap_tp=args.overlap_tp,
                                          fp8=args.fp8, cp_allgather=args.cp_allgather,
                                          fp8_param_gather=args.fp8_param_gather, optimizer=args.optimizer,
                                          muon_tp=args.muon_tp),
               keys=packed_keys(args.seq_len, args.doc_len, args.window))



def with_overrides(hw, args):
    """The profile with the --intra-gbps, --inter-gbps, --memory-gib and --hbm-gbps values put in."""
    from dataclasses import replace

    from hpcpar.runtime import UsageError
    given = {k: getattr(args, k) for k in ("intra_gbps", "inter_gbps", "memory_gib", "hbm_gbps")
             if getattr(args, k) is not None}
    if any(not v > 0 for v in given.values()):
        raise UsageError("--intra-gbps, --inter-gbps, --memory-gib and --hbm-gbps must be positive")
    changes = {"intra": replace(hw.intra, bandwidth=given["intra_gbps"] * 1e9) if "intra_gbps" in given else hw.intra,
               "inter": replace(hw.inter, bandwidth=given["inter_gbps"] * 1e9) if "inter_gbps" in given else hw.inter,
               "memory_bytes": given.get("memory_gib", hw.memory_bytes / 2**30) * 2**30,
               "hbm_bandwidth": given.get("hbm_gbps", hw.hbm_bandwidth / 1e9) * 1e9}
    return replace(hw, **changes)


def _space(args):
    """The search space with the pinned parts of the layout (--tp, --pp, --dp, --cp, --zero, --recompute)."""
    from hpcpar.tools.plan.search import Space
    from hpcpar.runtime import UsageError
    fixed = {k: getattr(args, k) for k in ("tp", "pp", "dp") if getattr(args, k)}
    if args.cp < 1 or any(v < 1 for v in fixed.values()):
        raise UsageError("--tp, --pp, --dp and --cp must be positive")
    fixed["cp"] = args.cp
    pinned, named = 1, []
    for name, size in fixed.items():     # refused here, or the search finds nothing and blames memory
        pinned, named = pinned * size, named + [f"--{name} {size}"]
        if args.gpus % pinned:
            what = named[-1] if args.gpus % size else " x ".join(n for n in named if not n.endswith(" 1"))
            raise UsageError(f"{what} does not divide the {args.gpus} GPUs")
    if args.zero is not None:
        fixed["zero"] = args.zero
    if args.dp_shard is not None:
        fixed["dp_shard"] = args.dp_shard
    if args.recompute:
        fixed["recompute"] = args.recompute
    if args.cp_kind:
        fixed["cp_kind"] = args.cp_kind
    if args.schedule:
        from hpcpar.pipeline.schedules import SCHEDULES
        if args.schedule not in SCHEDULES:
            raise UsageError(f"--schedule {args.schedule}: use one of {', '.join(SCHEDULES)}")
        fixed["schedule"] = args.schedule
    if args.ep:
        # ep is taken from the dp * cp ranks: known once dp, or tp and pp, are pinned
        shard = fixed["dp"] * args.cp if "dp" in fixed else \
            args.gpus // (fixed["tp"] * fixed["pp"]) if "tp" in fixed and "pp" in fixed else args.gpus
        if args.ep < 1 or shard % args.ep:
            raise UsageError(f"--ep {args.ep} does not divide the {shard} data x context-parallel ranks")
        fixed["ep"] = args.ep
    return Space(fixed=tuple(fixed.items()), max_tp=args.tp or 0)


def _table(estimates):
    head = f"{'#':>3}  {'layout':44s} {'step s':>8} {'tokens/s':>11} {'MFU':>6} {'GiB/GPU':>8} {'bubble':>7} {'comm':>6}"
    rows = [head, "-" * len(head)]
    for i, e in enumerate(estimates, 1):
        rows.append(f"{i:>3}  {str(e.layout):44s} {e.step:8.3f} {e.tokens_per_second:11,.0f} {e.mfu:6.1%} "
                    f"{e.memory_peak / 2**30:8.1f} {e.pipeline.bubble:7.1%} {e.comm / e.step:6.1%}")
    return "\n".join(rows)


def _calibrate(args):
    from pathlib import Path

    from hpcpar.tools.plan.calibrate import measure
    text = measure(gpus_per_node=args.gpus_per_node or 2)
    Path(args.out).write_text(text)
    print(text, end="")
    print(f"\nwrote {args.out}; use it as: hpcpar plan --hardware {args.out} --dtype fp32 ...")
    return 0


def _local(args):
    from hpcpar.tools.plan.local import explain_local, predict_local
    dtype = {"fp32": "float32", "fp64": "float64", None: "float32"}.get(args.dtype, args.dtype)
    print(explain_local(predict_local(args.hardware, model=args.model or "tiny", tp=args.tp or 1, pp=args.pp or 1,
                                      dp=args.dp or 1, schedule=args.schedule or "1f1b", microbatches=args.microbatches,
                                      chunks=args.chunks, batch_size=args.global_batch or 16, dtype=dtype,
                                      cp=args.cp, recompute=args.recompute or "none", zero=args.zero or 0)))
    return 0


def run(args):
    import time

    from hpcpar.runtime import UsageError
    if args.action == "calibrate":
        return _calibrate(args)
    if args.action == "local":
        return _local(args)
    if args.validate is not None:
        from hpcpar.tools.plan.published import RUNS
        from hpcpar.tools.plan.validate import report
        runs = [r for r in RUNS if args.validate.lower() in r.name.lower()]
        if not runs:
            raise UsageError(f"--validate {args.validate}: no published run's name contains it")
        print(report(runs))
        return 0
    from hpcpar.tools.plan.explain import explain
    from hpcpar.tools.plan.layout import parse_layout
    from hpcpar.tools.plan.search import search
    from hpcpar.tools.plan.step import estimate
    job = _job(args)
    if args.ep > 1 and not job.model.experts:
        raise UsageError(f"--ep {args.ep}: model {job.model.name} has no experts")
    if args.ep > 1 and job.model.experts % args.ep:
        raise UsageError(f"--ep {args.ep} does not divide the {job.model.experts} experts of {job.model.name}")
    start = time.perf_counter()
    if args.explain and args.explain != "top":
        layout = parse_layout(args.explain)
        reason = job.check(layout)
        if reason:
            raise UsageError(f"layout {layout}: {reason}")
        print(explain(estimate(job, layout)))
        return 0
    ranking = search(job, _space(args), refine=max(40, 2 * args.top))
    seconds = time.perf_counter() - start
    m = job.model
    active = f", {m.active_params(job.seq_len) / 1e9:.1f} B active" if m.experts else ""
    print(f"{m.name} ({m.params(job.seq_len) / 1e9:.1f} B parameters{active}) on {job.gpus} x {job.hardware.name} "
          f"({job.gpus_per_node} per node), batch {job.global_batch} x {job.seq_len} tokens, {job.dtype}")
    print(f"{ranking.considered} layouts divide the job, {ranking.fitting} fit in "
          f"{job.hardware.usable_bytes / 2**30:.1f} GiB; the best {len(ranking.estimates)} simulated "
          f"({seconds:.1f} s)\n")
    if not ranking.estimates:
        raise UsageError("no layout fits in memory: more GPUs, a smaller micro-batch or model, or recomputation")
    shown = ranking.estimates[:args.top]
    print(_table(shown))
    if args.explain == "top":
        print("\n" + explain(shown[0]))
    if args.plot:
        from hpcpar.tools.plan.plot import plot_layouts
        plot_layouts(shown, args.plot)
        print(f"\nwrote {args.plot}")
    return 0
