"""Simulate a pipeline schedule: an ASCII timeline (a row per device, a column per time unit) with
its makespan, busy share per device, bubble and peak in-flight activations; optionally the action
table and a PNG timeline.  No MPI: this is the plan the engine executes, run in simulated time.

Costs are per action, i.e. one micro-batch through one chunk of a rank's layers (for the
interleaved schedule a chunk holds 1/v of them).  A backward that is not split costs B + W.

  hpcpar schedule --stages 4 --microbatches 4 --forward-only
  hpcpar schedule --stages 4 --microbatches 8 --schedule zb-h1 --plot zb-h1.png
  hpcpar schedule --stages 4 --microbatches 8 --schedule interleaved --chunks 2 --table
  hpcpar schedule --stages 2 --microbatches 4 --blocking-sends     (the classic deadlock)
  hpcpar schedule --stages 4 --microbatches 8 --compare --costs 1,2,1
  hpcpar schedule --stages 4 --microbatches 8 --schedule zb-v --export zbv.csv
  hpcpar schedule --load zbv.csv --check --blocking-sends
"""
from hpcpar.cli import finite
from hpcpar.pipeline.schedules import KINDS, SCHEDULES   # pure Python, cheap to import

MAX_UNITS = 32768       # forwards (p x m x v) of the largest schedule drawn: seconds, not minutes

HELP = "simulate a pipeline schedule: ASCII/PNG timeline, bubble, memory"


def add_arguments(p):
    p.add_argument("--stages", type=int, help="pipeline ranks p (not with --load)")
    p.add_argument("--microbatches", type=int, help="micro-batches m per step (not with --load)")
    p.add_argument("--schedule", default="1f1b", choices=SCHEDULES,
                   help="default 1f1b")
    p.add_argument("--chunks", type=int, default=None,
                   help="model chunks v per rank (interleaved: default 2; zb-v, dualpipev: 2)")
    p.add_argument("--forward-only", action="store_true", help="forwards only (inference)")
    p.add_argument("--costs", default="1,1,1", metavar="F,B,W",
                   help="time of a forward, an input-gradient backward and a weight-gradient "
                        "backward (default 1,1,1)")
    p.add_argument("--latency", type=finite, default=0.0, help="time a message takes (default 0)")
    p.add_argument("--blocking-sends", action="store_true",
                   help="make every send wait for its receive (shows why order matters)")
    p.add_argument("--table", action="store_true", help="also print each rank's action list")
    p.add_argument("--plot", metavar="PNG", help="also draw the timeline into this PNG file")
    p.add_argument("--fb", type=finite, default=None, metavar="T",
                   help="time of an F&B pair run overlapped (dualpipev; default F + B + W, no overlap)")
    p.add_argument("--compare", action="store_true",
                   help="every schedule's makespan, bubble and peak activations side by side")
    p.add_argument("--check", action="store_true",
                   help="look for hangs (unmatched receives, cycles of waits, a warm-up longer than m; "
                        "with --blocking-sends also the circles of blocking sends) and stop there")
    p.add_argument("--export", metavar="CSV", help="write the schedule in torch.distributed.pipelining's "
                                                   "CSV action format")
    p.add_argument("--load", metavar="CSV", help="read the schedule from such a file instead of --schedule")


def _costs(text, latency, fb=None):
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
    if fb is not None and not 0 <= fb < inf:
        raise UsageError(f"--fb must be a non-negative number, got {fb:g}")
    return Costs(*values, latency=latency, FB=fb)


def _schedule(args):
    """The schedule the options name: read from --load, or built from --schedule."""
    from hpcpar.pipeline.schedules import build
    from hpcpar.runtime import UsageError
    if args.load:
        from hpcpar.pipeline.csv_format import read
        if args.stages or args.microbatches or args.chunks:
            raise UsageError("--load takes p, m and v from the file: leave out --stages, --microbatches "
                             "and --chunks")
        try:
            schedule = read(args.load)
        except (OSError, ValueError) as err:
            raise UsageError(f"--load {args.load}: {err}") from None
        if args.forward_only:
            schedule.actions = [[a for a in acts if a.op == "F"] for acts in schedule.actions]
            schedule.forward_only = True
        return schedule
    if args.stages is None or args.microbatches is None:
        raise UsageError("give --stages and --microbatches (or --load FILE)")
    chunks = args.chunks or KINDS[args.schedule].default_chunks
    check_size(args.stages, args.microbatches, chunks)
    try:
        return build(args.schedule, args.stages, args.microbatches, chunks, args.forward_only)
    except ValueError as err:
        raise UsageError(str(err)) from None


def check_size(p, m, v):
    """A schedule this command draws holds p x m x v forwards (and as many backwards), one row per rank:
    past MAX_UNITS it takes minutes and a screen no one reads, and it only repeats the same pattern."""
    from hpcpar.runtime import UsageError
    if p > 0 and m > 0 and v > 0 and p * m * v > MAX_UNITS:
        raise UsageError(f"--stages {p} x --microbatches {m}" + (f" x --chunks {v}" if v > 1 else "")
                         + f" = {p * m * v:,} forwards: hpcpar schedule draws at most {MAX_UNITS:,} (the pattern "
                         f"shows with far fewer micro-batches)")


def compare(p, m, costs):
    """One line per schedule: makespan, bubble of the whole step, the most one rank idles between
    its own first and last action, and the peak activations on one rank in whole stages.  The
    costs are those of a rank's whole share of the layers; a schedule with v chunks runs chunks of
    1/v of them, each costing 1/v, so that every line does the same work."""
    from dataclasses import replace

    from hpcpar.pipeline.schedules import build
    from hpcpar.pipeline.simulate import simulate
    lines = [f"{'schedule':<12} {'makespan':>9} {'bubble':>7} {'rank bubble':>12} {'peak act.':>10}"]
    for name, kind in KINDS.items():
        v = 2 if kind.chunked else 1
        chunk = replace(costs, F=costs.F / v, B=costs.B / v, W=costs.W / v,
                        FB=None if costs.FB is None else costs.FB / v)
        try:
            r = simulate(build(name, p, m, v), chunk)
        except ValueError as err:
            lines.append(f"{name:<12} refused: {err}")
            continue
        lines.append(f"{name:<12} {r.makespan:>9g} {r.bubble:>7.1%} {r.bubble_per_rank():>12g} "
                     f"{max(r.peak_inflight) / v:>10g}")
    return "\n".join(lines + ["(costs of a rank's whole layers, a chunk's 1/v of them; bubble: idle share "
                               "of p x makespan; rank bubble: the most one rank idles between its first "
                               "and last action; peak act.: micro-batches held through a whole stage)"])


def run(args):
    from hpcpar.pipeline.simulate import DeadlockError, simulate
    from hpcpar.pipeline.timeline import ascii_timeline
    costs = _costs(args.costs, args.latency, args.fb)
    if args.compare:
        from hpcpar.runtime import UsageError
        if args.load or args.stages is None or args.microbatches is None:
            raise UsageError("--compare builds every schedule: give --stages and --microbatches, not --load")
        check_size(args.stages, args.microbatches, 2)
        print(f"p={args.stages}, m={args.microbatches}, costs F,B,W = {costs.F:g},{costs.B:g},{costs.W:g}"
              + (f", F&B = {costs.FB:g}" if costs.FB is not None else ""))
        print(compare(args.stages, args.microbatches, costs))
        return 0
    schedule = _schedule(args)
    chunks = schedule.chunks
    title = (f"{schedule.name}: p={schedule.stages}, m={schedule.microbatches}"
             + (f", v={chunks}" if chunks > 1 else "") + (", forward only" if schedule.forward_only else "")
             + (f", cost F = {costs.F:g}" if schedule.forward_only else
                f", costs F,B,W = {costs.F:g},{costs.B:g},{costs.W:g}")
             + (f", latency {costs.latency:g}" if costs.latency else ""))
    print(title)
    if args.table:
        print(schedule.table())
    if args.export:
        from hpcpar.pipeline.csv_format import write
        write(schedule, args.export)
        print(f"wrote {args.export}")
    if args.check:
        from hpcpar.pipeline.check import ScheduleHazard, check
        try:
            check(schedule, blocking_sends=args.blocking_sends)
        except ScheduleHazard as err:
            print(f"refused ({err.kind}): {err}")
            return 1
        print("no hang: every receive has its send, no cycle of waits"
              + (" (even with blocking sends)" if args.blocking_sends else " (Isend, receives posted ahead)"))
        return 0
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
