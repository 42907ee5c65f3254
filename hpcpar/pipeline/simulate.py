"""Run a schedule's instruction lists in simulated time: timeline, bubble, memory, deadlocks.

Every rank executes its list (``Schedule.with_communication``) in order on its own clock:

* compute takes its cost (a B that is not split also does W's work: B + W);
* SEND is an ``Isend``: it costs nothing and the message arrives ``latency`` later;
* RECV blocks until its message has arrived: clock = max(clock, arrival).

A rank's clock depends only on its own list and the arrival times of its messages, so the result
does not depend on the order in which the simulator advances the ranks.  When no rank can advance
and some have instructions left, the schedule deadlocks, and the error says who waits for what.

With ``blocking_sends`` a SEND is a rendezvous (a blocking ``Send`` of a large message): sender and
receiver both wait until the other reaches the matching instruction.  1F1B written naively with
blocking sends deadlocks (docs/pipeline.md); the fix is non-blocking sends with receives posted ahead.

Statistics: makespan T; busy time of each rank; bubble = 1 - sum(busy) / (p T), the share of device
time spent waiting; peak in-flight = the most micro-batch chunks whose activations a rank holds at
once (forwarded, backward not yet run), which sets the activation memory.
"""
from dataclasses import dataclass
from fractions import Fraction
from math import ceil, gcd

from hpcpar.pipeline.schedules import COMPUTE


@dataclass
class Costs:
    """Time of one action (one micro-batch through one chunk) and of one message's flight.  ``FB``:
    the time of an F&B pair (``Action.overlap``: a forward overlapped with a whole backward, B and
    the W right after it, of another micro-batch); None runs the three one after the other."""
    F: float = 1.0
    B: float = 1.0
    W: float = 1.0
    latency: float = 0.0
    FB: float | None = None

    def of(self, action, split_backward):
        if action.op == "B" and not split_backward:
            return self.B + self.W   # an unsplit backward computes both gradients
        return getattr(self, action.op)

    def pair_share(self):
        """How much of its own cost each part of an F&B pair takes when the pair costs FB: all
        shrink in proportion, so the pair ends FB after it starts."""
        return 1.0 if self.FB is None else self.FB / (self.F + self.B + self.W)


class DeadlockError(Exception):
    """No rank can take its next instruction; the message names each stuck rank and why.
    ``stopped``: the index of the instruction each rank stands at (its list's length if done)."""

    def __init__(self, message, stopped=()):
        super().__init__(message)
        self.stopped = list(stopped)


@dataclass
class Event:
    rank: int
    start: float
    end: float
    action: object


@dataclass
class SimResult:
    schedule: object
    costs: Costs
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


def message_key(rank, action, schedule):
    """Key matching a SEND with its RECV: (kind, mb, source rank, target rank, target stage)."""
    kind = action.op[-1]
    s = schedule.stage(rank, action.chunk)
    if action.op.startswith("SEND"):
        return kind, action.mb, rank, action.peer, s + 1 if kind == "F" else s - 1
    return kind, action.mb, action.peer, rank, s


@dataclass(frozen=True)
class Prepared:
    """A program made ready to be simulated many times (the planner simulates one program under many
    costs): per rank its instructions, each message's key, and the compute instructions that form
    F&B pairs.  What depends on the costs is worked out per simulation, once per instruction."""
    program: list
    keys: list
    paired: list


def prepare(schedule, program=None):
    """``program`` (default: ``schedule.with_communication()``) with its message keys and pairs."""
    program = schedule.with_communication() if program is None else program
    keys = [[None if a.op in COMPUTE else message_key(r, a, schedule) for a in prog] for r, prog in enumerate(program)]
    return Prepared(program, keys, [_pairs(prog) for prog in program])


def simulate(schedule, costs=Costs(), blocking_sends=False, program=None):
    """Execute ``program`` (default: ``schedule.with_communication()``; or a ``prepare``-d one) and
    measure it.  ``costs``: one Costs for every rank, or a list of one per rank (stages that are not
    balanced, e.g. the last one also computes the output layer and the loss; a message takes its
    sender's latency)."""
    ready = program if isinstance(program, Prepared) else prepare(schedule, program)
    program, keys = ready.program, ready.keys
    p = schedule.stages
    rank_costs = list(costs) if isinstance(costs, (list, tuple)) else [costs] * p
    pc = [0] * p                    # next instruction of each rank
    clock = [0.0] * p
    arrival = {}                    # message key -> time it arrives (posted, not yet received)
    events = [[] for _ in range(p)]
    inflight, peak = [0] * p, [0] * p
    # each compute instruction's time (None for a message) and its change to the activations held:
    # worked out once per instruction, as a receive is tried again every time its rank comes round
    split = schedule.split_backward
    took = [[None if a.op not in COMPUTE else
             (rank_costs[r].pair_share() if i in ready.paired[r] else 1.0) * rank_costs[r].of(a, split)
             for i, a in enumerate(prog)] for r, prog in enumerate(program)]
    held = [[0 if schedule.forward_only else {"F": 1, "B": -1}.get(a.op, 0) for a in prog] for prog in program]

    def waiting(r, ops):
        """The instruction rank r stands at, if it is one of ``ops``."""
        return program[r][pc[r]] if pc[r] < len(program[r]) and program[r][pc[r]].op in ops else None

    def step(r):
        """Execute rank r's next instruction if it can run now; return whether it did."""
        i = pc[r]
        cost = took[r][i]
        if cost is not None:                                   # compute
            end = clock[r] + cost
            events[r].append(Event(r, clock[r], end, program[r][i]))
            clock[r] = end
            if held[r][i]:
                inflight[r] += held[r][i]
                peak[r] = max(peak[r], inflight[r])
        elif blocking_sends:
            # rendezvous: both sides leave together once both have arrived and the data has flown
            a = program[r][i]
            other = waiting(a.peer, ("RECV_F", "RECV_B") if a.op.startswith("SEND") else
                            ("SEND_F", "SEND_B"))
            if other is None or keys[a.peer][pc[a.peer]] != keys[r][i]:
                return False
            sender = r if a.op.startswith("SEND") else a.peer
            clock[r] = clock[a.peer] = max(clock[r], clock[a.peer]) + rank_costs[sender].latency
            pc[a.peer] += 1
        elif program[r][i].op.startswith("SEND"):
            arrival[keys[r][i]] = clock[r] + rank_costs[r].latency
        else:
            key = keys[r][i]
            if key not in arrival:
                return False
            clock[r] = max(clock[r], arrival.pop(key))
        pc[r] += 1
        return True

    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pc[r] < len(program[r]) and step(r):
                progress = True
    if any(pc[r] < len(program[r]) for r in range(p)) or arrival:
        raise DeadlockError(_explain(schedule, program, pc, arrival), pc)

    makespan = max(clock)
    busy = [sum(e.end - e.start for e in evs) for evs in events]
    idle = [evs[-1].end - evs[0].start - b if evs else 0.0 for evs, b in zip(events, busy)]
    return SimResult(schedule, costs, events, makespan, busy,
                     [b / makespan if makespan else 0.0 for b in busy],
                     1 - sum(busy) / (p * makespan) if makespan else 0.0, peak, idle)


def _pairs(program):
    """Indices of the instructions that form F&B pairs: an F marked ``overlap``, the B after it
    and, when it follows at once, that B's W (together a whole backward)."""
    compute = [i for i, a in enumerate(program) if a.op in COMPUTE]
    out = set()
    for k, i in enumerate(compute[:-1]):
        if program[i].overlap:
            b = program[compute[k + 1]]
            out |= {i, compute[k + 1]}
            if k + 2 < len(compute) and program[compute[k + 2]] == type(b)("W", b.mb, b.chunk):
                out.add(compute[k + 2])
    return out


def _explain(schedule, program, pc, arrival):
    """Why the run cannot finish: each stuck rank, its instruction, and either the missing partner
    instruction or the cycle of ranks waiting for each other; or, if every rank finished, the
    messages nobody received (their senders' requests would never complete)."""
    p = schedule.stages
    stuck = [r for r in range(p) if pc[r] < len(program[r])]
    if not stuck:
        return "\n".join(["every rank finished, but messages were never received:"] + [
            f"  rank {src} sent {kind} of micro-batch {mb} to rank {dst} (stage {stage})"
            for kind, mb, src, dst, stage in arrival])
    lines = ["deadlock: no rank can take its next instruction"]
    waits_for = {}
    for r in stuck:
        a = program[r][pc[r]]
        key = message_key(r, a, schedule)
        later = program[a.peer][pc[a.peer]:] if 0 <= a.peer < p else []
        partner = ("SEND_" if a.op.startswith("RECV") else "RECV_") + a.op[-1]
        if not any(b.op == partner and message_key(a.peer, b, schedule) == key for b in later):
            verb = "sends it" if partner.startswith("SEND") else "receives it"
            lines.append(f"  rank {r} waits at instruction #{pc[r]} {a}: no matching "
                         f"{partner} anywhere (rank {a.peer} never {verb})")
        else:
            lines.append(f"  rank {r} waits at instruction #{pc[r]} {a} for rank {a.peer}")
            waits_for[r] = a.peer
    for start in waits_for:
        path = [start]
        while path[-1] in waits_for and waits_for[path[-1]] not in path:
            path.append(waits_for[path[-1]])
        if waits_for.get(path[-1]) == start:
            lines.append("  cycle of waits: " + " -> ".join(f"rank {r}" for r in path + [start]))
            break
    return "\n".join(lines)


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
