"""Your own pipeline schedule, from the words `hpcpar schedule --table` prints, simulated and drawn.

    from hpcpar.course.own_schedule import schedule, draw
    mine = schedule(["F0 F1 B0 F2 B1 B2",              # one string per rank: its actions in order
                     "F0 B0 F1 B1 F2 B2"])
    result = draw(mine, "mine.png")                    # simulate, print the timeline, write the PNG

A word is F<mb>, B<mb> or W<mb> (W: the weight gradient of a split backward), with .<chunk> for a
later chunk of an interleaved rank ("F3.1"); in a program with its messages (exercise 14) also
sendF<mb>><rank>, recvB<mb><<rank> and the like.  ``schedule`` checks the lists (every micro-batch's
F before its B before its W, once each) and ``draw`` runs the package's simulator on them
(pipeline/simulate.py) and its plotter (pipeline/plot.py): the same numbers and pictures as
`hpcpar schedule`, for an order nobody has named.
"""
import re

from hpcpar.course.wrong import Wrong
from hpcpar.pipeline.schedules import Action, Schedule, validate
from hpcpar.pipeline.simulate import Costs, simulate
from hpcpar.pipeline.timeline import ascii_timeline

_WORD = re.compile(r"^(?:(?P<op>[FBW])(?P<mb>\d+)(?:\.(?P<chunk>\d+))?"
                   r"|(?P<verb>send|recv)(?P<what>[FB])(?P<mb2>\d+)(?P<dir>[<>])(?P<peer>\d+))$")


def parse(word):
    """'F3' -> Action("F", 3); 'F3.1' -> chunk 1; 'sendF3>1' -> Action("SEND_F", 3, peer=1): the words of
    Action.__str__."""
    m = _WORD.match(word)
    if m is None:
        raise Wrong(f"{word!r} is not an instruction: write F<mb>, B<mb>, W<mb>, sendF<mb>><rank>, recvB<mb><<rank> ...")
    if m["op"]:
        return Action(m["op"], int(m["mb"]), int(m["chunk"] or 0))
    if (m["verb"] == "send") != (m["dir"] == ">"):
        raise Wrong(f"{word!r}: a send points > at its receiver, a receive < at its sender")
    return Action(f"{m['verb'].upper()}_{m['what']}", int(m["mb2"]), peer=int(m["peer"]))


def schedule(rows, name="mine"):
    """A Schedule from one string (or list of words) per rank; raises ValueError naming the first
    action that cannot be (a B before its F, a micro-batch missing on some rank, ...)."""
    actions = [[parse(w) for w in (row.split() if isinstance(row, str) else row)] for row in rows]
    every = [a for acts in actions for a in acts]
    s = Schedule(name, len(rows), 1 + max(a.mb for a in every), 1 + max(a.chunk for a in every),
                 split_backward=any(a.op == "W" for a in every),
                 forward_only=not any(a.op == "B" for a in every), actions=actions)
    validate(s)
    return s


def draw(s, png=None, costs=Costs(), blocking_sends=False):
    """Simulate ``s``, print its timeline and statistics (as `hpcpar schedule` does), draw it into the PNG
    ``png`` when given; returns the SimResult.  A deadlock raises DeadlockError saying who waits for whom."""
    result = simulate(s, costs, blocking_sends=blocking_sends)
    print(ascii_timeline(result))
    if png:
        from hpcpar.pipeline.plot import plot_timeline
        plot_timeline(result.rows(), png, title=f"{s.name}: p={s.stages}, m={s.microbatches}")
    return result
