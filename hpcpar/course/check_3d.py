"""Exercises on the grid: a rank's coordinates, and which pipeline hops cross nodes."""
from hpcpar.course.wrong import Wrong
from hpcpar.comm.grid import GridLayout
from hpcpar.comm.placement import pipeline_hops

AXES = ("tp", "pp", "dp")


def coords(rank, tp, pp, dp):
    """Reference: (tp_i, pp_i, dp_i) of ``rank`` in the order tp-dp-pp (tp fastest)."""
    c = GridLayout(tp * pp * dp, tp=tp, pp=pp, dp=dp).coord(rank)
    return c.tp, c.pp, c.dp


def check_coords(f):
    for tp, pp, dp in ((2, 2, 2), (4, 2, 2), (1, 4, 2), (2, 3, 1), (3, 1, 2)):
        for rank in range(tp * pp * dp):
            got, want = tuple(f(rank, tp, pp, dp)), coords(rank, tp, pp, dp)
            if got != want:
                wrong = [a for a, g, w in zip(AXES, got + (None,) * 3, want) if g != w]
                raise Wrong(f"tp {tp} x pp {pp} x dp {dp}, rank {rank}: got (tp, pp, dp) = {got}; the "
                            f"{' and '.join(wrong)} coordinate{'s are' if len(wrong) > 1 else ' is'} wrong")


JOB = dict(tp=2, pp=4, dp=2, world=16, ranks_per_node=8)


def crossing_hops():
    """Reference: tp 2 x pp 4 x dp 2 on two nodes of 8 ranks, the default order."""
    return pipeline_hops(GridLayout(JOB["world"], tp=JOB["tp"], pp=JOB["pp"], dp=JOB["dp"]), JOB["ranks_per_node"])[0]


def check_crossing_hops(answer):
    want = crossing_hops()
    if not isinstance(answer, int):
        raise Wrong(f"ANSWER is a number of hops, got {answer!r}")
    if answer != want:
        raise Wrong(f"{answer} hops is too {'many' if answer > want else 'few'}")
