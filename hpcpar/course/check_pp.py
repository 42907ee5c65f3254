"""Pipeline exercises: the busy and total device time of a schedule, the 1F1B order, and a two-stage
pipeline whose blocking sends deadlock until the student reorders them."""
from collections import Counter

import numpy as np

from hpcpar.course.wrong import Wrong
from hpcpar.course.own_schedule import parse
from hpcpar.pipeline.schedules import Schedule, build
from hpcpar.pipeline.simulate import DeadlockError, simulate

# --- exercise 5: predict busy and total units ---------------------------------------------------------


def busy_of_total():
    """Reference: 4 stages, 4 micro-batches, forwards only, one time unit each (hpcpar schedule)."""
    result = simulate(build("1f1b", 4, 4, forward_only=True))
    return int(sum(result.busy)), int(result.device_time())


def check_busy_of_total(answer):
    want = busy_of_total()
    if not (isinstance(answer, tuple) and len(answer) == 2):
        raise Wrong(f"ANSWER is a pair (busy units, total units), got {answer!r}")
    for what, got, right in (("busy", answer[0], want[0]), ("total", answer[1], want[1])):
        if got != right:
            raise Wrong(f"the {what} units, {got}, are too {'high' if got > right else 'low'}")


# --- exercise 6: the 1F1B order ----------------------------------------------------------------------


def one_f_one_b(stage, stages, microbatches):
    """Reference: the package's 1F1B order of ``stage`` as ("F", mb) / ("B", mb) pairs."""
    return [(a.op, a.mb) for a in build("1f1b", stages, microbatches).actions[stage]]


def check_one_f_one_b(f):
    for p, m in ((4, 8), (4, 4), (2, 5), (4, 2), (1, 3)):
        for stage in range(p):
            want = one_f_one_b(stage, p, m)
            got = [tuple(a) for a in f(stage, p, m)]
            if sorted(got) != sorted(want):
                raise Wrong(f"p={p}, m={m}, stage {stage}: every micro-batch needs one F and one B, in all "
                            f"{2 * m} actions; got {len(got)}")
            i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w) if got != want else None
            if i is not None:
                raise Wrong(f"p={p}, m={m}, stage {stage}: the first {i} actions are right; action {i + 1} is "
                            f"{got[i]}, 1F1B runs {want[i]} there")


# --- exercise 14: a pipeline exchange that deadlocks ---------------------------------------------------

STAGES, MICROBATCHES = 2, 4
MESSAGE_NUMBERS = 1 << 20        # 8 MB of float64: far past MPI's eager limit, so a Send waits for its Recv
def naive_program():
    """1F1B on two stages with every message right after the action that makes it and right before the
    one that needs it: as words, one list per rank (the exercise's starting point)."""
    return [[str(a) for a in acts] for acts in build("1f1b", STAGES, MICROBATCHES).with_communication()]


def unblocked_program():
    """Reference: the naive program with each odd rank's adjacent (send, receive) pairs swapped, so that
    whenever two neighbours exchange, one receives while the other sends."""
    program = []
    for rank, words in enumerate(naive_program()):
        words = list(words)
        for i in range(len(words) - 1):
            if rank % 2 and words[i].startswith("send") and words[i + 1].startswith("recv"):
                words[i], words[i + 1] = words[i + 1], words[i]
        program.append(words)
    return program


def precheck_program(program):
    """The student's lists against 1F1B's compute order and messages, then the simulator with blocking
    sends: raises Wrong with the first problem."""
    schedule = build("1f1b", STAGES, MICROBATCHES)
    want = schedule.with_communication()
    if len(program) != STAGES:
        raise Wrong(f"PROGRAM has {len(program)} lists; one per rank, {STAGES}")
    actions = [[parse(w) for w in words] for words in program]
    for rank, (got, right) in enumerate(zip(actions, want)):
        compute = [a for a in got if a.op in ("F", "B")]
        if compute != schedule.actions[rank]:
            raise Wrong(f"rank {rank}: the compute order is no longer 1F1B's (first change at "
                        f"{next(str(a) for a, b in zip(compute + [None], schedule.actions[rank]) if a != b)}); "
                        "move only the sends and receives")
        if Counter(got) != Counter(right):
            extra = (Counter(got) - Counter(right)) or (Counter(right) - Counter(got))
            raise Wrong(f"rank {rank}: {next(iter(extra))} is {'extra' if Counter(got) - Counter(right) else 'missing'}"
                        ": every message of the step is sent once and received once")
        done = set()
        for a in got:
            if a.op in ("F", "B"):
                done.add((a.op, a.mb))
            elif a.op.startswith("SEND") and (a.op[-1], a.mb) not in done:
                raise Wrong(f"rank {rank}: {a} comes before {a.op[-1]}{a.mb}, which computes what it sends")
            elif a.op.startswith("RECV") and (a.op[-1], a.mb) in done:
                raise Wrong(f"rank {rank}: {a} comes after {a.op[-1]}{a.mb}, which needs what it receives")
    try:
        simulate(Schedule("yours", STAGES, MICROBATCHES, 1, False, False, schedule.actions),
                 blocking_sends=True, program=actions)
    except DeadlockError as err:
        raise Wrong("with blocking sends the simulator finds a " + str(err).split("\n", 1)[0].split(": ", 1)[0] +
                    ": " + "; ".join(line.strip() for line in str(err).splitlines()[1:])) from None


def _value(kind, mb):
    """What every number of a message holds: the checker can tell which message arrived."""
    return 10.0 * mb + (1 if kind == "F" else 2)


def check_program_mpi(program, comm):
    """Run this rank's list with blocking comm.send / comm.recv_ of 8 MB messages: it finishes only if
    the order lets every send meet its receive.  Every message must arrive with its own contents."""
    if comm.size != STAGES:
        raise Wrong(f"run on {STAGES} ranks")
    out, buf = np.empty(MESSAGE_NUMBERS), np.empty(MESSAGE_NUMBERS)
    received = []
    for a in (parse(w) for w in program[comm.rank]):
        if a.op.startswith("SEND"):
            out.fill(_value(a.op[-1], a.mb))
            comm.send(out, a.peer, tag=a.mb)
        elif a.op.startswith("RECV"):
            comm.recv_(buf, a.peer, tag=a.mb)
            received.append((a, float(buf[0]), bool((buf == buf[0]).all())))
    for a, first, uniform in received:
        if not uniform or first != _value(a.op[-1], a.mb):
            raise Wrong(f"{a} received another message's data: tags and order must pair each send with its receive")


def check_one_f_one_b_in_trainer(m, world):
    """Exercise 6's order as the trainer's 1F1B (hpcpar train --plug): pp 2 and pp 4, one rank's losses."""
    from hpcpar.course.plugged import GPT, check_in_trainer
    check_in_trainer(m, world, GPT, [dict(pp=2, microbatches=4), dict(pp=world.size, microbatches=6)])
