"""Pipeline schedules as data: for every rank, the ordered list of compute actions it runs.

The model is cut into S = p*v consecutive *virtual stages*; rank r holds the v chunks
``s = c*p + r`` (c = 0..v-1, Megatron's interleaving; v = 1 except for "interleaved").  Each of the m
micro-batches runs forward (F) through stages 0..S-1, the last stage computes the loss, and the
backward (B) runs through S-1..0.  Split schedules ("zb-h1") cut the backward in two: B computes
only the gradient of the stage's input (what the previous stage waits for) and W the gradient of
the weights (which nobody waits for, so it can fill idle time).

A schedule says only *in which order* each rank runs its actions; the sends and receives follow
from the neighbours (``Schedule.with_communication``) and the timing from the simulator
(simulate.py).  With uniform costs and t = F + B + W, one micro-batch's forward and whole backward
on one rank:

    schedule     order on each rank                          makespan                    memory
    gpipe        all forwards, then all backwards            (m + p - 1) t               m
    1f1b         warm-up forwards, then one F one B          (m + p - 1) t               p
    interleaved  1f1b over v chunks of 1/v of the layers     (m + (p - 1)/v) t           p + (p - 1)/v
    zb-h1        1f1b with W postponed into the bubbles      m t + (p - 1)(F + B - W)    p
    zb-h2        zb-h1 with a warm-up twice as long          m t + (p - 1) max(F, F+B-2W)  2p - 1

Exact in the simulator (tests/test_simulate.py) with no latency; interleaved and zb-h1 for m >= p,
zb-h2 for m >= 2p - 1, both zb while W <= min(F, B).  zb-h2 then idles (p - 1)(F + B - 2W) on every
rank between its first and last action, nothing at F = B = W: the makespan's (p - 1) F is only the
ramp of the ranks' start times, which the next step's forwards fill.  Memory: the activations rank 0
holds at most, in whole stages (interleaved: for m a multiple of p).  Details and pictures:
docs/pipeline.md.

The V schedules (zb-v, dualpipev: two chunks per rank placed as a V) are v_schedules.py's; an action,
a schedule's data and its messages, actions.py.
"""
from collections import Counter, deque
from dataclasses import dataclass

from hpcpar.pipeline.actions import COMPUTE, Action, Schedule, virtual_stage
from hpcpar.pipeline.v_schedules import dualpipev, v_stage, zb_v


# ---- the schedules: each returns rank r's action list ---------------------------------------

def _one_forward_one_backward(forwards, backwards, warmup):
    """Run ``warmup`` forwards, then alternate one forward and one backward while forwards remain,
    then the remaining backwards (cool-down).  Every backward frees one micro-batch's activations,
    so after the warm-up the rank never holds more than warmup + 1 of them."""
    steady = len(forwards) - warmup
    acts = list(forwards[:warmup])
    for i in range(steady):
        acts += [forwards[warmup + i], backwards[i]]
    return acts + list(backwards[steady:])


def _gpipe(rank, p, m, v):
    # all m forwards, then all m backwards: every micro-batch's activations are alive at once
    return [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]


def _1f1b(rank, p, m, v):
    # Rank r's first backward can start only once micro-batch 0 has gone down the remaining
    # p - 1 - r stages and back; that many forwards fill the wait (fewer if m is smaller).
    warmup = min(p - 1 - rank, m)
    return _one_forward_one_backward([Action("F", i) for i in range(m)],
                                     [Action("B", i) for i in range(m)], warmup)


def _groups(p, m):
    """Megatron's micro-batch groups: p at a time, so that one group on one chunk keeps the p ranks
    busy.  The m mod p left over join the *first* group.  Not a group of their own: rank 0 runs
    F(mb, c+1) len(group) forward slots after F(mb, c), and in between mb must come round the ring
    of p ranks; a group shorter than p makes rank 0 wait for it while the ring waits for rank 0's
    backwards, a deadlock (p=4, m=5, v=3 as 4 + 1).  First, because the warm-up must cover the
    largest group (``_interleaved``).  With m < p the only group is all m micro-batches."""
    first = p + m % p if m > p else m
    return [range(0, first)] + [range(a, a + p) for a in range(first, m, p)]


def _interleaved_order(p, m, v, backward):
    """(mb, chunk) in Megatron's order: each group goes through chunk 0, then chunk 1, ...; the
    backward visits the chunks in reverse (the loss is at the last chunk)."""
    order = []
    for group in _groups(p, m):
        for c in range(v):
            order += [(mb, v - 1 - c if backward else c) for mb in group]
    return order


def _interleaved(rank, p, m, v):
    forwards = [Action("F", mb, c) for mb, c in _interleaved_order(p, m, v, backward=False)]
    backwards = [Action("B", mb, c) for mb, c in _interleaved_order(p, m, v, backward=True)]
    # In a group of g the last rank's F(mb, v-1) comes (v-1) g slots after the B(mb, v-1) it has to
    # precede, so its warm-up covers (v-1) g forwards for the largest group, the first.  Rank r
    # adds the round trip to the last rank: two actions per stage in between (Megatron's warm-up).
    warmup = min((v - 1) * len(_groups(p, m)[0]) + 2 * (p - 1 - rank), m * v)
    return _one_forward_one_backward(forwards, backwards, warmup)


def _postpone_w(acts, delay):
    """A split order from an unsplit one: each B computes only the input gradient, and its W runs
    after ``delay`` more Bs (the last ``delay`` after the last B), where it fills time the rank would
    otherwise wait for the next backward."""
    out, waiting = [], deque()
    for a in acts:
        out.append(a)
        if a.op == "B":
            waiting.append(a)
            if len(waiting) > delay:
                out.append(Action("W", waiting.popleft().mb))
    return out + [Action("W", b.mb) for b in waiting]


def _zb_h1(rank, p, m, v):
    # 1F1B with the backward split; rank r postpones each weight gradient W until r more input
    # gradients B have run.  B is what the previous rank waits for, so it goes first; the postponed
    # Ws fill the cool-down, where rank r would otherwise wait for the late backwards of later
    # stages.  Rank r holds at most p - r micro-batches until B, exactly as 1F1B, plus r waiting
    # for their W: at most p on every rank, the peak of 1F1B's rank 0 (Qi et al. 2024, ZB-H1).
    return _postpone_w(_1f1b(rank, p, m, v), rank)


def _zb_h2(rank, p, m, v):
    # ZB-H2 (Qi et al. 2024): ZB-H1 with the bubble before the first B filled too.  Micro-batch 0
    # reaches rank r's B after going down p - 1 - r stages and back up as many, 2(p - 1 - r) slots
    # of F + B; the warm-up fills them with forwards instead of 1F1B's p - 1 - r, so rank r holds
    # up to 2(p - r) - 1 micro-batches (rank 0: 2p - 1, twice 1F1B's memory).  The Ws, postponed
    # by 2r backwards, make the drain a parallelogram: rank r ends 2r + 1 Ws after its last B,
    # just as it started r forwards after rank 0, so no rank idles between its first and last
    # action at F = B = W.  Fewer micro-batches than the warm-up: all m forwards first.
    warmup = min(2 * (p - 1 - rank), m)
    return _postpone_w(_one_forward_one_backward([Action("F", i) for i in range(m)],
                                                 [Action("B", i) for i in range(m)], warmup), 2 * rank)


@dataclass(frozen=True)
class Kind:
    """What a schedule declares about itself: its order, whether its backward is split in two, and
    where its chunks sit.  A new schedule is one order function and one line below."""
    order: object                       # (rank, p, m, v) -> the rank's compute actions
    split_backward: bool = False        # B = input gradient only, W = weight gradient; else B does both
    chunked: bool = False               # v >= 2 chunks per rank (every other schedule runs v = 1)
    placement: object = virtual_stage   # (rank, chunk, p) -> virtual stage
    min_microbatches: object = None     # p -> the fewest micro-batches its order is written for
    all_forwards_first: bool = False    # every forward before any backward: all m micro-batches in flight

    @property
    def default_chunks(self):
        """v when the user gives none: two chunks per rank for a chunked schedule."""
        return 2 if self.chunked else 1

    def fewest_microbatches(self, stages):
        return self.min_microbatches(stages) if self.min_microbatches else 1

    @property
    def v_shape(self):
        """Two chunks per rank, placed as a V (exactly two: the V has two arms)."""
        return self.placement is v_stage


KINDS = {"gpipe": Kind(_gpipe, all_forwards_first=True), "1f1b": Kind(_1f1b),
         "interleaved": Kind(_interleaved, chunked=True), "zb-h1": Kind(_zb_h1, split_backward=True),
         "zb-h2": Kind(_zb_h2, split_backward=True),
         "zb-v": Kind(zb_v, split_backward=True, chunked=True, placement=v_stage),
         "dualpipev": Kind(dualpipev, split_backward=True, chunked=True, placement=v_stage,
                           min_microbatches=lambda p: 2 * p)}
SCHEDULES = tuple(KINDS)                # the names every other part of the package offers


def refusal(name, stages, microbatches, chunks=1):
    """Why ``build`` refuses these sizes, in one line, or None: the rules every caller checks (the
    planner asks before it models a layout)."""
    if name not in KINDS:
        return f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}"
    kind = KINDS[name]
    for what, n in (("stages", stages), ("microbatches", microbatches), ("chunks", chunks)):
        if not isinstance(n, int) or n < 1:
            return f"{what} must be a positive integer, got {n!r}"
    if kind.chunked and chunks < 2:
        return f"the {name} schedule needs chunks >= 2 (with 1 chunk it is 1f1b)"
    if kind.v_shape and chunks != 2:
        return f"the {name} schedule places exactly 2 chunks per rank as a V, got chunks = {chunks}"
    least = kind.fewest_microbatches(stages)
    if microbatches < least:
        return (f"the {name} schedule needs at least {least} micro-batches on {stages} stages "
                f"(its warm-up alone runs that many), got {microbatches}")
    if not kind.chunked and chunks != 1:
        return (f"only the {', '.join(n for n, k in KINDS.items() if k.chunked)} schedules split a rank's layers "
                f"into chunks; {name} needs chunks = 1, got {chunks}")
    return None


def build(name, stages, microbatches, chunks=1, forward_only=False):
    """The schedule ``name`` for p = ``stages`` ranks, m micro-batches and v = ``chunks`` chunks
    per rank.  Forward-only (inference, evaluation) keeps each schedule's forward order and drops
    its backward actions."""
    reason = refusal(name, stages, microbatches, chunks)
    if reason:
        raise ValueError(reason)
    kind = KINDS[name]
    actions = [kind.order(r, stages, microbatches, chunks) for r in range(stages)]
    if forward_only:
        actions = [[a for a in acts if a.op == "F"] for acts in actions]
    return Schedule(name, stages, microbatches, chunks, split_backward=kind.split_backward,
                    forward_only=forward_only, actions=actions, placement=kind.placement)


def validate(schedule):
    """Raise ValueError naming the rank and action unless every rank runs, for every micro-batch
    and each of its chunks, exactly one F, then one B, then one W (B and W only when they exist),
    and nothing else."""
    s = schedule
    expected = {"F": 1, "B": 0 if s.forward_only else 1,
                "W": 1 if s.split_backward and not s.forward_only else 0}
    for rank, acts in enumerate(s.actions):
        seen = Counter()
        for a in acts:
            if not expected.get(a.op) or not 0 <= a.mb < s.microbatches or not 0 <= a.chunk < s.chunks:
                raise ValueError(f"rank {rank}: {a} is not an action of this schedule "
                                 f"(ops {'/'.join(op for op, n in expected.items() if n)}, "
                                 f"m={s.microbatches}, v={s.chunks})")
            seen[a.op, a.mb, a.chunk] += 1
            if seen[a.op, a.mb, a.chunk] > expected[a.op]:
                raise ValueError(f"rank {rank}: {a} runs more than once")
            before = COMPUTE[COMPUTE.index(a.op) - 1] if a.op != "F" else None
            if before and not seen[before, a.mb, a.chunk]:
                raise ValueError(f"rank {rank}: {a} runs before {Action(before, a.mb, a.chunk)}")
        for mb in range(s.microbatches):
            for c in range(s.chunks):
                for op, n in expected.items():
                    if seen[op, mb, c] < n:
                        raise ValueError(f"rank {rank}: {Action(op, mb, c)} is missing")
