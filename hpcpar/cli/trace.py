"""Read a trace written by `hpcpar train --trace out.json`.

  hpcpar trace summary out.json               per-rank busy, idle, communication and overlap shares,
                                              the measured bubble next to the simulator's prediction
  hpcpar trace plot out.json -o timeline.png  the measured timeline of one step, like hpcpar schedule --plot

The file itself opens in https://ui.perfetto.dev or chrome://tracing.
"""
HELP = "summarise or plot a trace from hpcpar train --trace"


def add_arguments(p):
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("summary", help="busy, idle, communication and overlap per rank")
    s.add_argument("path")
    pl = sub.add_parser("plot", help="draw the measured timeline of one step")
    pl.add_argument("path")
    pl.add_argument("-o", "--output", default="timeline.png", help="PNG to write (default timeline.png)")
    pl.add_argument("--step", type=int, default=None, help="which traced step (default: the last)")


def run(args):
    from hpcpar import trace_report
    from hpcpar.runtime import UsageError
    try:
        if args.action == "summary":
            print(trace_report.summary(args.path))
        else:
            print(f"wrote {trace_report.plot(args.path, args.output, args.step)}")
    except (OSError, ValueError, KeyError) as err:
        raise UsageError(f"cannot read trace {args.path}: {err}") from None
    return 0
