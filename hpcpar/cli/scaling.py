"""Run a scaling study: the same training at several rank counts, one MPI job per point, then its
figures - time per step, speedup, efficiency, tokens/s, communication share - as a CSV and PNG plots.

  hpcpar scaling --ranks 1,2,4 --mode strong --layouts dp --model tiny --steps 20
  hpcpar scaling --ranks 1,2,4,8 --mode weak --layouts dp,tp2dp --batch-size 8 --out runs/weak
  hpcpar scaling --ranks 2,4,8 --layouts tp2/tp2pp2/tp2pp2dp2 --launcher srun    (in a Slurm job)
  hpcpar scaling report runs/weak          redraw the CSV and the plots from the stored results

--layouts: comma-separated series, one line on the plots each.  dp, tp or pp: every rank on that
axis; tp2dp: tp 2, and dp takes the rest; tp2pp2dp2: exactly that layout (8 ranks); tp1/tp2/tp2pp2:
one layout per rank count.  --mode strong keeps --batch-size as the global batch of every point;
weak makes it the batch per rank (N ranks train on N x --batch-size sequences per step).  Every
other flag below is hpcpar train's and goes to every point (--no-progress: no bar over the sweep).
--repeat 3 runs the sweep three times and plots each point's fastest run.  Output in --out:
results/*.json (one per run: the command, its exit status, the summary), logs/*.log, scaling.csv
and the PNGs.  Exit status 1 if a run failed.  docs/scaling.md explains the study and how to read
the plots.
"""
from hpcpar.cli import finite

HELP = "a strong or weak scaling sweep of hpcpar train -> JSON per run, CSV and PNG plots"


def add_arguments(p):
    from hpcpar.cli import train
    from hpcpar.tools.scaling.layouts import MODES
    from hpcpar.tools.scaling.sweep import LAUNCHERS
    p.add_argument("action", nargs="?", choices=["report"], help="report DIR: redraw the CSV and plots of DIR")
    p.add_argument("directory", nargs="?", metavar="DIR", help="the output directory of a sweep (for report)")
    g = p.add_argument_group("the sweep")
    g.add_argument("--ranks", help="rank counts, comma-separated, e.g. 1,2,4,8")
    g.add_argument("--mode", default="strong", choices=MODES,
                   help="strong: the same global batch at every point; weak: --batch-size per rank (default strong)")
    g.add_argument("--layouts", default="dp",
                   help="series of layouts, comma-separated: dp, tp, pp, tp2dp, tp2pp2dp2, tp1/tp2/tp2pp2 (default dp)")
    g.add_argument("--launcher", default="mpiexec", choices=LAUNCHERS,
                   help="mpiexec ($HPCPAR_MPIEXEC, else the venv's) or srun ($HPCPAR_SRUN, else "
                        "'srun --mpi=pmi2'), with -n N (default mpiexec)")
    g.add_argument("--out", metavar="DIR", help="output directory (default runs/scaling-<mode>-<date>-<time>)")
    g.add_argument("--timeout", type=finite, default=600.0, help="seconds each run may take (default 600)")
    g.add_argument("--repeat", type=int, default=1,
                   help="run the sweep R times in a rotating order; the report keeps each point's fastest "
                        "run, the least disturbed on a shared machine (default 1)")
    train.add_arguments(p)


def _under_mpi():
    """Started by an MPI launcher (which a batch script is not)?"""
    import os
    return any(var in os.environ for var in ("PMI_RANK", "PMI_FD", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))


def _show(rows, paths):
    from hpcpar.tools.scaling.report import table
    print(table(rows))
    print("wrote " + ", ".join(str(p) for p in paths))


def _sweep(args):
    import sys
    import time
    from pathlib import Path

    from hpcpar.runtime import EXIT_FAILURE, UsageError
    from hpcpar.tools.scaling import layouts, report, sweep
    if args.directory:
        raise UsageError(f"unexpected argument {args.directory!r} (to redraw: hpcpar scaling report {args.directory})")
    if not args.ranks:
        raise UsageError("hpcpar scaling needs --ranks, e.g. --ranks 1,2,4 (or: hpcpar scaling report DIR)")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    if args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    if _under_mpi():
        raise UsageError("hpcpar scaling starts its own MPI jobs: run it from a shell or a batch script, "
                         "not under mpiexec or srun")
    cfg = sweep.base_config(args)
    points = layouts.points(layouts.parse_ranks(args.ranks), layouts.parse_layouts(args.layouts), args.mode,
                            cfg.batch_size)
    configs = sweep.checked_configs(points, cfg)
    out = Path(args.out or time.strftime(f"runs/scaling-{args.mode}-%Y%m%d-%H%M%S"))
    records = sweep.sweep(points, configs, args.launcher, sweep.passed_flags(args), out, args.timeout,
                          args.repeat, progress=getattr(args, "progress", True))
    _show(*report.report(out))
    failed = [f"{r['series']} on {r['ranks']}" for r in records if r["summary"] is None]
    if failed:
        print(f"hpcpar scaling: {len(failed)} of {len(records)} run(s) failed: {', '.join(failed)} "
              f"(their logs: {out / 'logs'})", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def run(args):
    from hpcpar.runtime import UsageError
    from hpcpar.tools.scaling.report import report
    if args.action != "report":
        return _sweep(args)
    if not args.directory:
        raise UsageError("hpcpar scaling report needs the sweep's directory: hpcpar scaling report DIR")
    _show(*report(args.directory))
    return 0
