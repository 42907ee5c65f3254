"""Exercises on the grid: a rank's coordinates, and which pipeline hops cross nodes."""
from hpcpar.course.exercise import Wrong
from hpcpar.grid import GridLayout
from hpcpar.placement import pipeline_hops


def coords(rank, tp, pp, dp):
    """Reference: (tp_i, pp_i, dp_i) of ``rank`` in the order tp-dp-pp (tp fastest)."""
    c = GridLayout(tp * pp * dp, tp=tp, pp=pp, dp=dp).coord(rank)
    return c.tp, c.pp, c.dp


def check_coords(f):
    for tp, pp, dp in ((2, 2, 2), (4, 2, 2), (1, 4, 2), (2, 3, 1), (3, 1, 2)):
        for rank in range(tp * pp * dp):
            got, want = tuple(f(rank, tp, pp, dp)), coords(rank, tp, pp, dp)
            if got != want:
                raise Wrong(f"tp {tp} x pp {pp} x dp {dp}, rank {rank}: got (tp, pp, dp) = {got}, expected "
                            f"{want}; rank = tp_i + tp x (dp_i + dp x pp_i). See: .venv/bin/hpcpar grid "
                            f"--tp {tp} --pp {pp} --dp {dp} --world {tp * pp * dp}")


def crossing_hops():
    """Reference: tp 4 x pp 2 x dp 2 on two nodes of 8 ranks, the default order."""
    return pipeline_hops(GridLayout(16, tp=4, pp=2, dp=2), 8)[0]


def check_crossing_hops(answer):
    want = crossing_hops()
    if answer != want:
        raise Wrong(f"{answer} hops: stage 0 of both replicas is ranks 0-7, stage 1 is ranks 8-15. Measure: "
                    ".venv/bin/hpcpar grid --tp 4 --pp 2 --dp 2 --world 16 --ranks-per-node 8")
