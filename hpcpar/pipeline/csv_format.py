"""Schedules as files, in torch.distributed.pipelining's CSV action format ("compute only").

One row per rank, one cell per compute action, ``{stage}{type}{micro-batch}`` with the *virtual
stage* (not the local chunk) and the types

    F   forward                          I   input gradient (hpcpar's B of a split backward)
    B   whole backward (input + weights) W   weight gradient
    (3F5;4B2)OVERLAP_F_B                 an F&B pair: the forward and the whole backward together

and empty cells for idle slots, which carry no meaning for the order and are skipped.  The stages a
rank names are its chunks, in increasing order: chunk c of rank r is the c-th smallest stage r runs,
which is Megatron's placement for an interleaved file and the V for a ZB-V or DualPipeV file.

hpcpar writes I and W where its backward is split, B where it is not, and an F&B pair with the W
that follows its B as one OVERLAP_F_B; a file's B in a schedule that has any I or W is read as a B
with its W right after it.  So hpcpar -> file -> hpcpar gives the same action lists, and torch's
ZB-V file comes back as the same text (its DualPipeV file with "I, W" for each lone whole "B").
"""
import csv
import io
import re

from hpcpar.pipeline.actions import Action, Schedule, virtual_stage
from hpcpar.pipeline.v_schedules import v_stage

_CELL = re.compile(r"(\d+)(F|I|B|W)(\d+)$")
_PAIR = re.compile(r"\(([^;]+);([^;]+)\)OVERLAP_F_B$")


def dumps(schedule):
    """The schedule's compute actions as CSV text, one row per rank."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for rank, acts in enumerate(schedule.actions):
        row, i = [], 0
        while i < len(acts):
            a = acts[i]
            stage = schedule.stage(rank, a.chunk)
            if a.overlap:                          # F&B: the pair's B is a whole backward
                b = acts[i + 1]
                whole = not schedule.split_backward or (i + 2 < len(acts)
                                                       and acts[i + 2] == Action("W", b.mb, b.chunk))
                if not whole:
                    raise ValueError(f"rank {rank}: the F&B pair {a}&{b} needs its W right after it "
                                     f"(a whole backward) to be written as OVERLAP_F_B")
                row.append(f"({stage}F{a.mb};{schedule.stage(rank, b.chunk)}B{b.mb})OVERLAP_F_B")
                i += 3 if schedule.split_backward else 2
                continue
            kind = "I" if a.op == "B" and schedule.split_backward else a.op
            row.append(f"{stage}{kind}{a.mb}")
            i += 1
        writer.writerow(row)
    return out.getvalue()


def _cell(rank, text):
    m = _CELL.match(text)
    if not m:
        raise ValueError(f"rank {rank}: cannot read the action {text!r} (expected e.g. 2F0, 3I1, "
                         f"1B4, 0W2 or (3F5;4B2)OVERLAP_F_B)")
    return int(m[1]), m[2], int(m[3])


def loads(text, name="file"):
    """A Schedule from CSV text; ValueError naming the rank and cell for what it cannot read.  The
    result is not yet checked: pass it to ``schedules.validate`` and ``check.check``."""
    rows = [[c.strip() for c in row] for row in csv.reader(io.StringIO(text))]
    while rows and not any(rows[-1]):
        rows.pop()                                  # a trailing empty line
    parsed = []                                     # per rank: (stage, type, mb, pair start?)
    for rank, row in enumerate(rows):
        cells = []
        for text in filter(None, row):
            pair = _PAIR.match(text)
            if pair:
                (fs, ft, fm), (bs, bt, bm) = _cell(rank, pair[1].strip()), _cell(rank, pair[2].strip())
                if ft != "F" or bt != "B":
                    raise ValueError(f"rank {rank}: {text!r} pairs {ft} with {bt}; an OVERLAP_F_B "
                                     f"pairs an F with a whole backward B")
                cells += [(fs, "F", fm, True), (bs, "B", bm, False)]
            else:
                cells.append((*_cell(rank, text), False))
        parsed.append(cells)
    if not parsed:
        raise ValueError("the schedule file has no rows")
    p = len(parsed)
    stages = [sorted({c[0] for c in cells}) for cells in parsed]
    owner = {}
    for rank, mine in enumerate(stages):
        for s in mine:
            if s in owner:
                raise ValueError(f"stage {s} appears on rank {owner[s]} and on rank {rank}")
            owner[s] = rank
    v = len(stages[0])
    if any(len(mine) != v for mine in stages):
        raise ValueError("every rank must hold the same number of stages, got "
                         + ", ".join(f"rank {r}: {len(mine)}" for r, mine in enumerate(stages)))
    if sorted(owner) != list(range(p * v)):
        raise ValueError(f"the stages must be 0..{p * v - 1}, got {sorted(owner)}")
    split = any(c[1] in "IW" for cells in parsed for c in cells)
    m = 1 + max(c[2] for cells in parsed for c in cells)
    actions = []
    for rank, cells in enumerate(parsed):
        chunk = {s: i for i, s in enumerate(stages[rank])}
        acts = []
        for s, kind, mb, overlap in cells:
            op = {"I": "B"}.get(kind, kind)
            acts.append(Action(op, mb, chunk[s], overlap=overlap))
            if kind == "B" and split:
                acts.append(Action("W", mb, chunk[s]))  # a whole backward: its W at once
        actions.append(acts)
    return Schedule(name, p, m, v, split_backward=split, forward_only=not any(
        a.op == "B" for acts in actions for a in acts), actions=actions, placement=_placement(stages))


def _placement(stages):
    """The placement the file's stage lists spell: Megatron's or the V when they are, else a table."""
    p, v = len(stages), len(stages[0])
    for known in (virtual_stage, v_stage):
        if v <= 2 or known is virtual_stage:
            if all(known(r, c, p) == stages[r][c] for r in range(p) for c in range(v)):
                return known
    return Placement(tuple(tuple(mine) for mine in stages))


class Placement:
    """A placement read from a file: ``table[rank][chunk]`` is the virtual stage."""

    def __init__(self, table):
        self.table = table

    def __call__(self, rank, chunk, stages):
        return self.table[rank][chunk]


def write(schedule, path):
    with open(path, "w", newline="") as f:
        f.write(dumps(schedule))


def read(path):
    with open(path, newline="") as f:
        return loads(f.read(), name=f"file {path}")
