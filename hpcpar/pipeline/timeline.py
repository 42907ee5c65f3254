"""What a simulated step gives (simulate.py runs it): every rank's compute events, the statistics, and
the ASCII timeline ``hpcpar schedule`` prints.

Statistics: makespan T; busy time of each rank; bubble = 1 - sum(busy) / (p T), the share of device
time spent waiting; peak in-flight = the most micro-batch chunks whose activations a rank holds at
once (forwarded, backward not yet run), which sets the activation memory.  The PNG picture of the same
rows: plot.py.
"""
from dataclasses import dataclass
from fractions import Fraction
from math import ceil, gcd


@dataclass
class Event:
    rank: int
    start: float
    end: float
    action: object


@dataclass
class SimResult:
    schedule: object
    costs: object         # the simulate.Costs it ran with
    events: list          # per rank, its compute events in order
    makespan: float
    busy: list            # per rank, time spent computing
    busy_share: list      # busy / makespan
    bubble: float         # 1 - sum(busy) / (p * makespan)
    peak_inflight: list   # per rank, most (mb, chunk) holding activations for a backward at once
    idle: list            # per rank, time idle between its first start and its last end

    def bubble_per_rank(self):
        """The zero-bubble paper's and DualPipe's "bubble": the most any rank idles between its
        own first start and last end.  Unlike ``bubble`` it leaves out the ramps at either end
        of a rank that starts late or ends early, which the next step's first forwards (ZB's
        optimizer step without a synchronisation) would fill."""
        return max(self.idle, default=0.0)

    def rows(self):
        """The timeline as ``plot.plot_timeline`` draws it: per rank (start, end, op, mb, chunk)."""
        return [[(e.start, e.end, e.action.op, e.action.mb, e.action.chunk) for e in evs]
                for evs in self.events]

    def device_time(self):
        """Device time the step occupies: every device, from the first start to the last end."""
        return len(self.busy) * self.makespan

    def summary(self):
        busy = "  ".join(f"dev {r} {share:.0%}" for r, share in enumerate(self.busy_share))
        idle_per_busy = self.bubble / (1 - self.bubble) if self.bubble < 1 else float("inf")
        peak = ("none (forward only: nothing is kept for a backward)" if self.schedule.forward_only
                else " ".join(str(n) for n in self.peak_inflight))
        return "\n".join([
            f"makespan  {self.makespan:g} time units",
            f"busy      {busy}",
            f"units     {sum(self.busy):g} busy of {self.device_time():g} "
            f"({len(self.busy)} devices x {self.makespan:g} time units)",
            f"bubble    {self.bubble:.0%} of device time = {idle_per_busy:.0%} of the ideal "
            f"(busy) time",
            f"peak in-flight micro-batches (activations held for backward): {peak}"])


def _auto_unit(result):
    """The largest time step that every start and end is a whole multiple of (rational costs),
    or the shortest action when that would make the timeline unreadably wide."""
    times = [Fraction(t).limit_denominator(1000) for evs in result.events for e in evs
             for t in (e.start, e.end)]
    unit = Fraction(0)
    for t in times:
        unit = Fraction(gcd(unit.numerator * t.denominator, t.numerator * unit.denominator),
                        unit.denominator * t.denominator)
    if unit == 0 or result.makespan / unit > 200:
        return min((e.end - e.start for evs in result.events for e in evs if e.end > e.start),
                   default=1.0)
    return float(unit)


def ascii_timeline(result, unit=None):
    """A row per device, a column per ``unit`` of time; a cell shows the action running at the
    column's midpoint ("F1", "B3", "W0", chunk c > 0 as "F1.c") or "." when the device is idle;
    then the statistics."""
    unit = unit or _auto_unit(result)
    columns = ceil(result.makespan / unit - 1e-9)
    cells = []
    for evs in result.events:
        row, i = [], 0
        for c in range(columns):
            mid = (c + 0.5) * unit
            while i < len(evs) and evs[i].end <= mid:
                i += 1
            row.append(str(evs[i].action) if i < len(evs) and evs[i].start <= mid else ".")
        cells.append(row)
    width = max([len(s) for row in cells for s in row] + [len(str(columns - 1))])
    lines = ["time   " + " ".join(str(c).ljust(width) for c in range(columns)).rstrip()]
    lines += [f"dev {r:<2} " + " ".join(s.ljust(width) for s in row).rstrip()
              for r, row in enumerate(cells)]
    if unit != 1:
        lines.append(f"(one column = {unit:g} time units)")
    return "\n".join(lines) + "\n" + result.summary()
