"""Find a schedule's hangs before any rank communicates.

A schedule (built, or read from a file) is refused with the ranks, the actions and the cycle named
when its messages can block:

    warm-up        a rank runs more forwards before its first backward than the run has micro-batch
                   chunks (a warm-up written for m >= p, run with fewer: torchtitan#775), or a file
                   written for another number of micro-batches than the run's
    structure      an action of a micro-batch or chunk that does not exist, one missing, or one
                   out of order (``schedules.validate``)
    unmatched      a receive that no send matches: its rank waits forever
    cycle          ranks waiting for each other in a circle; when a receive sits ahead of compute
                   it does not need but its sender waits for, the finding says which compute and
                   that moving the receive after it breaks the circle
    blocking       (only with ``blocking_sends``) a circle that exists only because a send waits for
                   its receive: two neighbours that each send before they receive, or every rank
                   batching its sends and receives in one fixed order (Megatron-LM#5100,
                   pytorch#172668's two-node hang)

The engine (engine.py) sends with Isend and posts its receives ahead, so the last class cannot hang
it: ``check`` refuses it only when asked about blocking sends (``hpcpar schedule --check
--blocking-sends``).  The others hang any runtime, this one included, and are always refused.

The run is the simulator's (simulate.py) with unit costs: a deadlock there is a deadlock for every
timing, because each rank's order and each message's match do not depend on time.
"""
from hpcpar.pipeline.schedules import COMPUTE, validate
from hpcpar.pipeline.simulate import Costs, DeadlockError, message_key, simulate


class ScheduleHazard(ValueError):
    """A schedule that can hang; ``kind`` is one of the classes above, the message says where."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def check(schedule, microbatches=None, blocking_sends=False, program=None):
    """Raise ScheduleHazard for the first hazard found (in the order of the table above), else
    return the schedule's programs with communication.  ``microbatches``: the run's m, when the
    schedule comes from a file; ``program``: explicit per-rank instruction lists (messages
    included) to check instead of ``schedule.with_communication()``."""
    if program is None:
        _check_warmup(schedule, microbatches)
        try:
            validate(schedule)
        except ValueError as err:
            raise ScheduleHazard("structure", f"schedule {schedule.name}: {err}") from None
        program = schedule.with_communication()
    _check_messages(schedule, program, blocking=False)
    if blocking_sends:
        _check_messages(schedule, program, blocking=True)
    return program


def _check_warmup(s, microbatches):
    if microbatches is not None and microbatches != s.microbatches:
        raise ScheduleHazard("warm-up", f"schedule {s.name} is written for {s.microbatches} micro-batches, "
                                        f"the run has {microbatches}")
    for rank, acts in enumerate(s.actions):
        first_b = next((i for i, a in enumerate(acts) if a.op == "B"), len(acts))
        warmup = sum(a.op == "F" for a in acts[:first_b])
        if first_b < len(acts) and warmup > s.microbatches * s.chunks:
            raise ScheduleHazard("warm-up", f"rank {rank} runs {warmup} forwards before its first backward "
                                            f"{acts[first_b]}, but m = {s.microbatches} micro-batches "
                                            f"give {s.microbatches * s.chunks}")


def _check_messages(s, program, blocking):
    try:
        simulate(s, Costs(), blocking_sends=blocking, program=program)
    except DeadlockError as err:
        text = str(err)
        if "no matching" in text or "never received" in text:
            raise ScheduleHazard("unmatched", f"schedule {s.name}: {text}") from None
        if blocking:
            raise ScheduleHazard("blocking", f"schedule {s.name} hangs when a send waits for its receive "
                                             f"(hpcpar's engine does not: Isend, receives posted ahead): "
                                             f"{text}") from None
        hint = _receive_ahead(s, program, err.stopped)
        raise ScheduleHazard("cycle", f"schedule {s.name}: {text}" + (f"\n  {hint}" if hint else "")) from None


def _receive_ahead(s, program, stopped):
    """For a rank stuck at a receive whose sender waits for something this rank would send later:
    the compute between the receive and that send, which does not need the receive."""
    for r, i in enumerate(stopped):
        if i >= len(program[r]) or not program[r][i].op.startswith("RECV"):
            continue
        a = program[r][i]
        q = a.peer
        if stopped[q] >= len(program[q]) or not program[q][stopped[q]].op.startswith("RECV"):
            continue
        wanted = message_key(q, program[q][stopped[q]], s)
        for j in range(i + 1, len(program[r])):
            b = program[r][j]
            if b.op.startswith("SEND") and message_key(r, b, s) == wanted:
                between = [str(c) for c in program[r][i + 1:j] if c.op in COMPUTE
                           and (c.mb, c.chunk) != (a.mb, a.chunk)]
                if between:
                    return (f"rank {r} receives {a} ahead of {', '.join(between)}, which does not need it, "
                            f"while rank {q} waits for {b} that comes after: move {a} after {b}")
    return ""
