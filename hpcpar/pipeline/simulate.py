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

What a simulation gives - the events, makespan, bubble, peak in-flight micro-batches - and its ASCII
timeline: timeline.py.
"""
from dataclasses import dataclass

from hpcpar.pipeline.actions import COMPUTE, Action
from hpcpar.pipeline.timeline import Event, SimResult


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


def message_key(rank, action, schedule):
    """Key matching a SEND with its RECV: (kind, mb, source rank, target rank, target stage)."""
    kind = action.op[-1]
    s = schedule.stage(rank, action.chunk)
    if action.op.startswith("SEND"):
        return kind, action.mb, rank, action.peer, s + 1 if kind == "F" else s - 1
    return kind, action.mb, action.peer, rank, s


# the kinds of steps in a Prepared order
RUN, POST, TAKE, MEET = range(4)      # compute, a non-blocking send, a receive, a blocking send's rendezvous


@dataclass(frozen=True)
class Prepared:
    """A program made ready to be simulated many times (the planner simulates one program under many
    costs): per rank its instructions, and the order in which the simulator takes them.  Which
    instruction can run next never depends on the costs (a receive waits for its message to be *sent*,
    whatever the time it arrives), so the order is found once, without clocks, and every simulation
    replays it (any order that can run gives the same numbers: the module docstring says why).
    ``order``: (kind, rank, index, what) with what a cost code (``cost_code``) for RUN, a message
    number for POST and TAKE, and for MEET (a blocking send's rendezvous, one step for both sides)
    (the other side's rank, its index, the sending rank); ``stopped``: where each rank stands when
    nothing can run (its list's length if done); ``unreceived``: the keys of messages sent and never
    received; ``blocking_sends``: the sends the order was found for."""
    program: list
    order: tuple
    stopped: tuple
    unreceived: tuple
    blocking_sends: bool


def cost_code(op, paired):
    """The index of a compute instruction's time in ``_times``: its op, and whether it is part of an F&B pair."""
    return 2 * COMPUTE.index(op) + paired


def _times(costs, split_backward):
    """One rank's time of each cost code: F, B, W alone and in an F&B pair (which shrinks each part)."""
    share = costs.pair_share()
    return [(share if paired else 1.0) * costs.of(Action(op, 0), split_backward)
            for op in COMPUTE for paired in (False, True)]


def prepare(schedule, program=None, blocking_sends=False):
    """``program`` (default: ``schedule.with_communication()``) with the order the simulator takes its
    instructions in: each rank in turn runs until it must wait, round after round.  With
    ``blocking_sends`` a send waits for its receive, and the two run as one step."""
    program = schedule.with_communication() if program is None else program
    p = len(program)
    number = {}                    # message key -> a small integer, the replay's index
    codes = {(op, paired): cost_code(op, paired) for op in COMPUTE for paired in (False, True)}
    steps = []                     # per rank, each instruction's step as the order will hold it
    for r, prog in enumerate(program):
        pairs, rank_steps = _pairs(prog), []
        for i, a in enumerate(prog):
            if a.op in COMPUTE:
                rank_steps.append((RUN, r, i, codes[a.op, i in pairs]))
            else:
                kind = MEET if blocking_sends else POST if a.op.startswith("SEND") else TAKE
                rank_steps.append((kind, r, i, number.setdefault(message_key(r, a, schedule), len(number))))
        steps.append(rank_steps)
    pc, order, sent = [0] * p, [], {}        # sent: messages posted and not received yet
    progress = True
    while progress:
        progress = False
        for r in range(p):
            rank_steps, i = steps[r], pc[r]
            while i < len(rank_steps):
                step = rank_steps[i]
                if step[0] == TAKE:
                    if step[3] not in sent:
                        break
                    del sent[step[3]]
                elif step[0] == POST:
                    sent[step[3]] = None
                elif step[0] == MEET:     # both sides at the two ends of the same message, or wait
                    q, sending = program[r][i].peer, program[r][i].op.startswith("SEND")
                    j = pc[q]
                    if j >= len(steps[q]) or steps[q][j][0] != MEET or steps[q][j][3] != step[3] \
                            or program[q][j].op.startswith("SEND") == sending:
                        break
                    sender = r if sending else q
                    step = (MEET, r, i, (q, j, sender))
                    pc[q] += 1
                order.append(step)
                i += 1
            progress = progress or i > pc[r]
            pc[r] = i
    keys = list(number)
    return Prepared(program, tuple(order), tuple(pc), tuple(keys[n] for n in sent), blocking_sends)


def _replay(ready, times, latency):
    """Every rank's clock after each of its instructions, taking them in ``ready.order``: a compute
    adds its time, a send's message arrives ``latency`` after it is posted, a receive waits for it.
    ``times[r]``: rank r's time per cost code; ``latency[r]``: its sends' flight time."""
    clock = [0.0] * len(ready.program)
    after = [[0.0] * len(prog) for prog in ready.program]
    arrival = [0.0] * len(ready.order)
    for kind, r, i, what in ready.order:
        if kind == RUN:
            clock[r] += times[r][what]
        elif kind == POST:
            arrival[what] = clock[r] + latency[r]
        elif kind == TAKE:
            clock[r] = max(clock[r], arrival[what])
        else:      # rendezvous: both sides leave together once both have arrived and the data has flown
            q, j, sender = what
            clock[r] = clock[q] = after[q][j] = max(clock[r], clock[q]) + latency[sender]
        after[r][i] = clock[r]
    return clock, after


def _ready(schedule, blocking_sends, program):
    """``program`` prepared for ``blocking_sends`` (as given if it already is); refuses a deadlock."""
    ready = program if isinstance(program, Prepared) and program.blocking_sends == blocking_sends else \
        prepare(schedule, program.program if isinstance(program, Prepared) else program, blocking_sends)
    if any(at < len(prog) for at, prog in zip(ready.stopped, ready.program)) or ready.unreceived:
        raise DeadlockError(_explain(schedule, ready.program, ready.stopped, ready.unreceived), ready.stopped)
    return ready


def makespan(schedule, costs=Costs(), program=None):
    """The simulated step time alone, with non-blocking sends and one Costs for every rank (the
    planner's question, asked under many costs of one ``prepare``-d program)."""
    ready = _ready(schedule, False, program)
    times = _times(costs, schedule.split_backward)
    return max(_replay(ready, [times] * schedule.stages, [costs.latency] * schedule.stages)[0])


def simulate(schedule, costs=Costs(), blocking_sends=False, program=None):
    """Execute ``program`` (default: ``schedule.with_communication()``; or a ``prepare``-d one) and
    measure it.  ``costs``: one Costs for every rank, or a list of one per rank (stages that are not
    balanced, e.g. the last one also computes the output layer and the loss; a message takes its
    sender's latency)."""
    ready = _ready(schedule, blocking_sends, program)
    program, p = ready.program, schedule.stages
    rank_costs = list(costs) if isinstance(costs, (list, tuple)) else [costs] * p
    times = [_times(c, schedule.split_backward) for c in rank_costs]
    clock, after = _replay(ready, times, [c.latency for c in rank_costs])
    events, peak = [[] for _ in range(p)], [0] * p
    for r, prog in enumerate(program):
        held = 0
        for i, a in enumerate(prog):
            if a.op in COMPUTE:
                events[r].append(Event(r, after[r][i - 1] if i else 0.0, after[r][i], a))
                if not schedule.forward_only and a.op in ("F", "B"):    # a forward holds activations, its B frees them
                    held += 1 if a.op == "F" else -1
                    peak[r] = max(peak[r], held)
    span = max(clock)
    busy = [sum(e.end - e.start for e in evs) for evs in events]
    idle = [evs[-1].end - evs[0].start - b if evs else 0.0 for evs, b in zip(events, busy)]
    return SimResult(schedule, costs, events, span, busy, [b / span if span else 0.0 for b in busy],
                     1 - sum(busy) / (p * span) if span else 0.0, peak, idle)


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
