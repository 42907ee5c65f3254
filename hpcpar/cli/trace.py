"""Read a trace written by `hpcpar train --trace out.json`.

  hpcpar trace summary out.json               per-rank busy, idle, communication and overlap shares,
                                              the measured bubble next to the simulator's prediction
  hpcpar trace plot out.json                  the measured timeline of one step, like hpcpar schedule --plot,
                                              into out.png beside the trace (-o to choose)
  hpcpar trace plot out.json --annotate       ... with the communication lanes, the pipeline messages'
                                              arrows, and notes on a TP all-reduce, a send and the bubble
  hpcpar trace plot out.json --zero          ZeRO-3's gathers, waits, per-unit compute, frees and
                                              reduce-scatters instead (hpcpar/tools/trace/zero_plot.py)
  hpcpar trace why RUN/flight                 after a hang or a dead rank: who stopped, who waited for whom
                                              (from the flight records, hpcpar/watch/why.py)

The file itself opens in https://ui.perfetto.dev or chrome://tracing.
"""
HELP = "summarise or plot a trace from hpcpar train --trace; explain a hang from its flight records"


def add_arguments(p):
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("summary", help="busy, idle, communication and overlap per rank")
    s.add_argument("path")
    pl = sub.add_parser("plot", help="draw the measured timeline of one step")
    pl.add_argument("path")
    pl.add_argument("-o", "--output", default=None, help="PNG to write (default: the trace's path with .png)")
    pl.add_argument("--annotate", action="store_true",
                    help="draw communication lanes and message arrows, and label what to look at")
    pl.add_argument("--zero", action="store_true",
                    help="draw ZeRO-3's all-gathers, waits, per-unit compute, frees and reduce-scatters")
    pl.add_argument("--step", type=int, default=None, help="which traced step (default: the last)")
    w = sub.add_parser("why", help="who stopped and who waited for whom, from a run's flight records")
    w.add_argument("path", help="the flight directory (<run dir>/flight)")


def run(args):
    from pathlib import Path

    from hpcpar.tools.trace import report as trace_report
    from hpcpar.runtime import UsageError
    if args.action == "why":
        from hpcpar.watch.why import explain
        try:
            print(explain(args.path))
        except (OSError, ValueError, KeyError) as err:
            raise UsageError(f"cannot read flight records in {args.path}: {err}") from None
        return 0
    try:
        if args.action == "summary":
            print(trace_report.summary(args.path))
        else:
            out = args.output or str(Path(args.path).with_suffix(".png"))
            if args.zero:
                from hpcpar.tools.trace.zero_plot import plot_zero
                print(f"wrote {plot_zero(args.path, out, args.step)}")
            else:
                print(f"wrote {trace_report.plot(args.path, out, args.step, args.annotate)}")
    except (OSError, ValueError, KeyError) as err:
        raise UsageError(f"cannot read trace {args.path}: {err}") from None
    return 0
