"""Exercise 24: ZB-V's order, written by the student for every rank, graded by the hang checker
(pipeline/check.py) and the simulator: it must run without a hang and idle no more on any rank than
the package's zb-v at F = B = W."""
from hpcpar.course.wrong import Wrong
from hpcpar.pipeline.check import ScheduleHazard, check
from hpcpar.pipeline.schedules import Action, Schedule, build, v_stage
from hpcpar.pipeline.simulate import simulate

SIZES = ((2, 3), (2, 4), (3, 7), (4, 8), (4, 10))     # m >= 2p - 1: ZB-V's warm-up exists whole


def zb_v(rank, stages, microbatches):
    """Reference: the package's ZB-V order of ``rank`` as (op, mb, chunk) triples."""
    return [(a.op, a.mb, a.chunk) for a in build("zb-v", stages, microbatches, 2).actions[rank]]


def _schedule(f, p, m):
    actions = []
    for rank in range(p):
        try:
            actions.append([Action(op, int(mb), int(c)) for op, mb, c in f(rank, p, m)])
        except (TypeError, ValueError):
            raise Wrong(f"p={p}, m={m}, rank {rank}: return (op, micro-batch, chunk) triples") from None
    return Schedule("yours", p, m, 2, split_backward=True, forward_only=False, actions=actions,
                    placement=v_stage)


def _turn_of_the_v(s):
    """The hop from stage p-1 to p stays on the last rank: no message, so the check's simulator cannot
    see it; the order must run F(mb) before F(mb).1 there, and B(mb).1 before B(mb)."""
    acts = s.actions[s.stages - 1]
    where = {(a.op, a.mb, a.chunk): i for i, a in enumerate(acts)}
    for mb in range(s.microbatches):
        for op, first, then in (("F", 0, 1), ("B", 1, 0)):
            if where.get((op, mb, then), 0) < where.get((op, mb, first), 0):
                raise Wrong(f"p={s.stages}, m={s.microbatches}, rank {s.stages - 1}: a hang: {Action(op, mb, then)} "
                            f"waits for {Action(op, mb, first)}, which this rank runs only after it (the turn of "
                            f"the V stays on one rank: no message, so the ranks' wait cycle is this rank alone)")


def held_until_w(s):
    """Per rank, the most chunks whose activations it holds at once, counted from F to W: a weight
    gradient needs the layer's input, so a micro-batch's activations stay until its W, not its B (the
    simulator's peak counts to B)."""
    peaks = []
    for acts in s.actions:
        held = peak = 0
        for a in acts:
            held += {"F": 1, "W": -1}.get(a.op, 0)
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def check_zb_v(f):
    for p, m in SIZES:
        s = _schedule(f, p, m)
        try:
            check(s)
        except ScheduleHazard as err:
            raise Wrong(f"p={p}, m={m}: the hang checker refuses it ({err.kind}): "
                        + str(err).splitlines()[0] + " " + " ".join(str(err).splitlines()[1:3])) from None
        _turn_of_the_v(s)
        got, want = simulate(s), simulate(build("zb-v", p, m, 2))
        if got.bubble_per_rank() > want.bubble_per_rank() + 1e-9:
            worst = max(range(p), key=lambda r: got.idle[r])
            raise Wrong(f"p={p}, m={m}: no hang, but rank {worst} idles {got.idle[worst]:g} units between its first "
                        f"and last action at F = B = W = 1; ZB-V idles {want.bubble_per_rank():g}")
        mine, zbv = held_until_w(s), held_until_w(build("zb-v", p, m, 2))
        worst = max(range(p), key=lambda r: mine[r] - zbv[r])
        if mine[worst] > zbv[worst]:
            raise Wrong(f"p={p}, m={m}: rank {worst} holds the activations of {mine[worst]} chunks at once, counted "
                        f"until their W (a W needs its layer's input); ZB-V holds {zbv[worst]} there - a W kept "
                        "back longer than the drain needs keeps its micro-batch's memory")
        if max(got.peak_inflight) > max(want.peak_inflight):
            raise Wrong(f"p={p}, m={m}: a rank holds {max(got.peak_inflight)} chunks' activations at once; "
                        f"ZB-V needs no more than {max(want.peak_inflight)}")
