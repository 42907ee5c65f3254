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

Exact in the simulator (tests/test_simulate.py) with no latency; interleaved and zb-h1 for m >= p,
zb-h1 while W <= min(F, B).  Memory: the activations rank 0 holds at most, in whole stages
(interleaved: for m a multiple of p).  Details and pictures: docs/pipeline.md.
"""
from collections import Counter, deque
from dataclasses import dataclass

COMPUTE = ("F", "B", "W")


@dataclass(frozen=True)
class Action:
    """One instruction of a rank: compute (F, B, W) or communication (SEND_F, RECV_F, SEND_B,
    RECV_B) of micro-batch ``mb`` for the rank's local model chunk ``chunk``; ``peer`` is the
    rank at the other end of a message."""
    op: str
    mb: int
    chunk: int = 0
    peer: int | None = None

    def __str__(self):
        chunk = f".{self.chunk}" if self.chunk else ""   # chunk 0 unmarked: "F3", chunk 1: "F3.1"
        if self.peer is None:
            return f"{self.op}{self.mb}{chunk}"
        verb, what = self.op.split("_")
        arrow = ">" if verb == "SEND" else "<"
        return f"{verb.lower()}{what}{self.mb}{chunk}{arrow}{self.peer}"   # "sendF3>2", "recvB0<1"


def virtual_stage(rank, chunk, stages):
    """The model block held by ``rank`` as its chunk ``chunk`` (0..S-1): Megatron's placement, chunk c
    of rank r is virtual stage c*p + r, so consecutive stages sit on consecutive ranks round the ring."""
    return chunk * stages + rank


@dataclass
class Schedule:
    name: str
    stages: int            # p: pipeline ranks
    microbatches: int      # m
    chunks: int            # v: model chunks per rank
    split_backward: bool   # True: B = input gradient and W = weight gradient; False: B does both
    forward_only: bool
    actions: list          # per rank, the compute actions in execution order
    placement: object = virtual_stage     # (rank, chunk, p) -> virtual stage: where each chunk sits

    def stage(self, rank, chunk):
        """The virtual stage ``rank`` runs as its local chunk ``chunk``."""
        return self.placement(rank, chunk, self.stages)

    def holders(self):
        """Virtual stage -> the (rank, chunk) that runs it: the placement read backwards."""
        return {self.stage(r, c): (r, c) for r in range(self.stages) for c in range(self.chunks)}

    def ends(self):
        """(the rank holding virtual stage 0, the rank holding the last one): who reads the inputs, and
        who reads the targets and computes the loss.  The same rank under a V placement."""
        held = self.holders()
        return held[0][0], held[self.stages * self.chunks - 1][0]

    def table(self):
        """The action lists, one row per rank, in aligned columns."""
        width = max((len(str(a)) for acts in self.actions for a in acts), default=1)
        head = (f"{self.name}: p={self.stages} stages, m={self.microbatches} micro-batches"
                + (f", v={self.chunks} chunks per rank (X.c = chunk c)" if self.chunks > 1 else "")
                + (", forward only" if self.forward_only else ""))
        rows = [f"rank {r}: " + " ".join(str(a).ljust(width) for a in acts).rstrip()
                for r, acts in enumerate(self.actions)]
        return "\n".join([head] + rows)

    def with_communication(self):
        """The same lists with the messages inserted: the activation is received right before the
        F that needs it and sent right after the F that made it, the gradient likewise around B.
        W never communicates.  Virtual stage 0 reads the input and the last one computes the loss,
        so they receive (respectively send) nothing."""
        last = self.stages * self.chunks - 1
        holder = {s: r for s, (r, _) in self.holders().items()}
        programs = []
        for rank, acts in enumerate(self.actions):
            program = []
            for a in acts:
                s = self.stage(rank, a.chunk)
                if a.op == "F" and s > 0:
                    program.append(Action("RECV_F", a.mb, a.chunk, holder[s - 1]))
                if a.op == "B" and s < last:
                    program.append(Action("RECV_B", a.mb, a.chunk, holder[s + 1]))
                program.append(a)
                if a.op == "F" and s < last:
                    program.append(Action("SEND_F", a.mb, a.chunk, holder[s + 1]))
                if a.op == "B" and s > 0:
                    program.append(Action("SEND_B", a.mb, a.chunk, holder[s - 1]))
            programs.append(program)
        return programs


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


def _zb_h1(rank, p, m, v):
    # 1F1B with the backward split; rank r postpones each weight gradient W until r more input
    # gradients B have run.  B is what the previous rank waits for, so it goes first; the postponed
    # Ws fill the cool-down, where rank r would otherwise wait for the late backwards of later
    # stages.  Rank r holds at most p - r micro-batches until B, exactly as 1F1B, plus r waiting
    # for their W: at most p on every rank, the peak of 1F1B's rank 0 (Qi et al. 2024, ZB-H1).
    acts, waiting = [], deque()
    for a in _1f1b(rank, p, m, v):
        acts.append(a)
        if a.op == "B":
            waiting.append(a)
            if len(waiting) > rank:
                acts.append(Action("W", waiting.popleft().mb))
    return acts + [Action("W", b.mb) for b in waiting]


@dataclass(frozen=True)
class Kind:
    """What a schedule declares about itself: its order, whether its backward is split in two, and
    where its chunks sit.  A new schedule is one order function and one line below."""
    order: object                       # (rank, p, m, v) -> the rank's compute actions
    split_backward: bool = False        # B = input gradient only, W = weight gradient; else B does both
    chunked: bool = False               # v >= 2 chunks per rank (every other schedule runs v = 1)
    placement: object = virtual_stage   # (rank, chunk, p) -> virtual stage
    all_forwards_first: bool = False    # every forward before any backward: all m micro-batches in flight

    @property
    def default_chunks(self):
        """v when the user gives none: two chunks per rank for a chunked schedule."""
        return 2 if self.chunked else 1


KINDS = {"gpipe": Kind(_gpipe, all_forwards_first=True), "1f1b": Kind(_1f1b),
         "interleaved": Kind(_interleaved, chunked=True), "zb-h1": Kind(_zb_h1, split_backward=True)}
SCHEDULES = tuple(KINDS)                # the names every other part of the package offers


def build(name, stages, microbatches, chunks=1, forward_only=False):
    """The schedule ``name`` for p = ``stages`` ranks, m micro-batches and v = ``chunks`` chunks
    per rank.  Forward-only (inference, evaluation) keeps each schedule's forward order and drops
    its backward actions."""
    if name not in KINDS:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    kind = KINDS[name]
    for what, n in (("stages", stages), ("microbatches", microbatches), ("chunks", chunks)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{what} must be a positive integer, got {n!r}")
    if kind.chunked and chunks < 2:
        raise ValueError(f"the {name} schedule needs chunks >= 2 (with 1 chunk it is 1f1b)")
    if not kind.chunked and chunks != 1:
        raise ValueError(f"only the interleaved schedule splits a rank's layers into chunks; "
                         f"{name} needs chunks = 1, got {chunks}")
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
