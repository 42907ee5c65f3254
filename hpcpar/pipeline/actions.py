"""A pipeline schedule as data: the actions of each rank, where its chunks sit, and the messages.

An ``Action`` is one instruction of one rank (F, B, W of a micro-batch and chunk, or a message); a
``Schedule`` holds every rank's compute actions in execution order and the *placement* that says which
virtual stage each rank's chunks are (Megatron's round-robin ``virtual_stage``, or a V).  The messages
follow from the placement (``Schedule.with_communication``).  Which orders exist, and the rules for
their sizes: schedules.py; the V family's orders: v_schedules.py.
"""
from dataclasses import dataclass, field

COMPUTE = ("F", "B", "W")


@dataclass(frozen=True)
class Action:
    """One instruction of a rank: compute (F, B, W) or communication (SEND_F, RECV_F, SEND_B,
    RECV_B) of micro-batch ``mb`` for the rank's local model chunk ``chunk``; ``peer`` is the
    rank at the other end of a message.  ``overlap`` marks an F that runs as one F&B pair with the
    B right after it (DualPipe): both receives are taken before the pair, and F's activation is
    sent before B computes, so one's communication hides behind the other's compute.  It is not
    part of the action's identity: F3 paired is still F3."""
    op: str
    mb: int
    chunk: int = 0
    peer: int | None = None
    overlap: bool = field(default=False, compare=False)

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


def holders(placement, stages, chunks):
    """Virtual stage -> the (rank, chunk) that runs it, for ``placement`` on p = ``stages`` ranks of
    ``chunks`` chunks each (a Schedule's, or a Kind's before any order is built: the planner's)."""
    return {placement(r, c, stages): (r, c) for r in range(stages) for c in range(chunks)}


def ends(placement, stages, chunks):
    """(the rank holding virtual stage 0, the rank holding the last one) under ``placement``."""
    held = holders(placement, stages, chunks)
    return held[0][0], held[stages * chunks - 1][0]


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
        return holders(self.placement, self.stages, self.chunks)

    def ends(self):
        """(the rank holding virtual stage 0, the rank holding the last one): who reads the inputs, and
        who reads the targets and computes the loss.  The same rank under a V placement."""
        return ends(self.placement, self.stages, self.chunks)

    def embedding_ranks(self, last_uses_embedding):
        """The pipeline ranks whose copies of the token embedding have their gradients summed every step:
        the first stage's and the last stage's, when the last one uses the embedding too (a tied head, the
        MTP modules' lookups) and another rank holds it; () when one rank holds both ends (a V: it uses the
        embedding itself) or the last stage does not use it."""
        first, last = self.ends()
        return (first, last) if last_uses_embedding and first != last else ()

    def table(self):
        """The action lists, one row per rank, in aligned columns."""
        cell = lambda a: f"{a}&" if a.overlap else str(a)     # "F3& B1.1": one F&B pair
        width = max((len(cell(a)) for acts in self.actions for a in acts), default=1)
        head = (f"{self.name}: p={self.stages} stages, m={self.microbatches} micro-batches"
                + (f", v={self.chunks} chunks per rank (X.c = chunk c)" if self.chunks > 1 else "")
                + (", forward only" if self.forward_only else ""))
        rows = [f"rank {r}: " + " ".join(cell(a).ljust(width) for a in acts).rstrip()
                for r, acts in enumerate(self.actions)]
        return "\n".join([head] + rows)

    def with_communication(self):
        """The same lists with the messages inserted: the activation is received right before the
        F that needs it and sent right after the F that made it, the gradient likewise around B.
        W never communicates.  Virtual stage 0 reads the input and the last one computes the loss,
        so they receive (respectively send) nothing; neither does a hop between two stages of one
        rank (the turn of a V), which stays in memory.  An F&B pair (``Action.overlap``) is one
        group: both receives first, then F and its send, so that the activation travels while B
        computes, then B and its send."""
        last = self.stages * self.chunks - 1
        holder = {s: r for s, (r, _) in self.holders().items()}
        programs = []
        for rank, acts in enumerate(self.actions):
            program, group = [], []
            stage_of = [self.stage(rank, c) for c in range(self.chunks)]     # local chunk -> virtual stage
            for a in acts:
                group.append(a)
                if a.overlap:
                    continue                      # its B comes next: exchange their messages together
                recvs, sends, computes = [], [], []
                for g in group:
                    s = stage_of[g.chunk]
                    if g.op == "F" and s > 0 and holder[s - 1] != rank:
                        recvs.append(Action("RECV_F", g.mb, g.chunk, holder[s - 1]))
                    if g.op == "B" and s < last and holder[s + 1] != rank:
                        recvs.append(Action("RECV_B", g.mb, g.chunk, holder[s + 1]))
                    computes.append(g)
                    if g.op == "F" and s < last and holder[s + 1] != rank:
                        computes.append(Action("SEND_F", g.mb, g.chunk, holder[s + 1]))
                    if g.op == "B" and s > 0 and holder[s - 1] != rank:
                        sends.append(Action("SEND_B", g.mb, g.chunk, holder[s - 1]))
                program += recvs + computes + sends
                group = []
            programs.append(program + group)
        return programs
