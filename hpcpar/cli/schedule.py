"""Simulate a pipeline schedule: an ASCII timeline (a row per device, a column per time unit) with
its makespan, busy share per device, bubble and peak in-flight activations; optionally the action
table and a PNG timeline.  No MPI: this is the plan the engine executes, run in simulated time.

Costs are per action, i.e. one micro-batch through one chunk of a rank's layers (for the
interleaved schedule a chunk holds 1/v of them).  A backward that is not split costs B + W.

  hpcpar schedule --stages 4 --microbatches 4 --forward-only
  hpcpar schedule --stages 4 --microbatches 8 --schedule zb-h1 --plot zb-h1.png
  hpcpar schedule --stages 4 --microbatches 8 --schedule interleaved --chunks 2 --table
  hpcpar schedule --stages 2 --microbatches 4 --blocking-sends     (the classic deadlock)
"""
from hpcpar.pipeline.schedules import SCHEDULES   # pure Python, cheap to import

HELP = "simulate a pipeline schedule: ASCII/PNG timeline, bubble, memory"


def add_arguments(p):
    p.add_argument("--stages", type=int, required=True, help="pipeline ranks p")
    p.add_argument("--microbatches", type=int, required=True, help="micro-batches m per step")
    p.add_argument("--schedule", default="1f1b", choices=SCHEDULES,
                   help="default 1f1b")
    p.add_argument("--chunks", type=int, default=None,
                   help="model chunks v per rank (interleaved only; default 2 there)")
    p.add_argument("--forward-only", action="store_true", help="forwards only (inference)")
    p.add_argument("--costs", default="1,1,1", metavar="F,B,W",
                   help="time of a forward, an input-gradient backward and a weight-gradient "
                        "backward (default 1,1,1)")
    p.add_argument("--latency", type=float, default=0.0, help="time a message takes (default 0)")
    p.add_argument("--blocking-sends", action="store_true",
                   help="make every send wait for its receive (shows why order matters)")
    p.add_argument("--table", action="store_true", help="also print each rank's action list")
    p.add_argument("--plot", metavar="PNG", help="also draw the timeline into this PNG file")


def _costs(text, latency):
    from hpcpar.pipeline.simulate import Costs
    from hpcpar.runtime import UsageError
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        values = []
    inf = float("inf")   # comparisons with nan are false, so nan is refused too
    if len(values) != 3 or not all(0 <= x < inf for x in values):
        raise UsageError(f"--costs takes three non-negative numbers F,B,W, got {text!r}")
    if not 0 <= latency < inf:
        raise UsageError(f"--latency must be a non-negative number, got {latency:g}")
    return Costs(*values, latency=latency)


def run(args):
    from hpcpar.pipeline.schedules import KINDS, build
    from hpcpar.pipeline.simulate import DeadlockError, ascii_timeline, simulate
    from hpcpar.runtime import UsageError
    costs = _costs(args.costs, args.latency)
    chunks = args.chunks or KINDS[args.schedule].default_chunks
    try:
        schedule = build(args.schedule, args.stages, args.microbatches, chunks, args.forward_only)
    except ValueError as err:
        raise UsageError(str(err)) from None
    title = (f"{schedule.name}: p={schedule.stages}, m={schedule.microbatches}"
             + (f", v={chunks}" if chunks > 1 else "") + (", forward only" if args.forward_only else "")
             + (f", cost F = {costs.F:g}" if args.forward_only else
                f", costs F,B,W = {costs.F:g},{costs.B:g},{costs.W:g}")
             + (f", latency {costs.latency:g}" if costs.latency else ""))
    print(title)
    if args.table:
        print(schedule.table())
    try:
        result = simulate(schedule, costs, blocking_sends=args.blocking_sends)
    except DeadlockError as err:
        print(err)
        return 1
    print(ascii_timeline(result))
    if args.plot:
        from hpcpar.pipeline.plot import plot_timeline
        plot_timeline(result.rows(), args.plot, title=title)
        print(f"wrote {args.plot}")
    return 0
