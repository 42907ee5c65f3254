"""Exercises on checkpoints and traces: resharding a tensor, the bubble and the hidden communication
measured from a trace's intervals."""
import numpy as np

from hpcpar.course.exercise import Wrong
from hpcpar.nn.parameter import Shard
from hpcpar.pipeline.bubble import pipeline_bubble
from hpcpar.trace_report import _overlap, _union


def reshard(pieces, dim, new_parts):
    """Reference: the pieces of a tensor cut in len(pieces) equal parts along ``dim``, cut again into
    ``new_parts`` (what loading a checkpoint on another tp does: assemble, then take)."""
    full_shape = list(pieces[0].shape)
    full_shape[dim] *= len(pieces)
    full = Shard(dim, len(pieces), 0).assemble(list(pieces), tuple(full_shape))
    return [Shard(dim, new_parts, i).take(full) for i in range(new_parts)]


def check_reshard(f):
    full = np.arange(4 * 12, dtype=float).reshape(4, 12)
    for dim, old, new in ((1, 2, 4), (1, 4, 2), (0, 2, 4), (1, 3, 1), (0, 1, 2)):
        pieces = np.split(full, old, axis=dim)
        got = f([p.copy() for p in pieces], dim, new)
        want = np.split(full, new, axis=dim)
        if len(got) != new:
            raise Wrong(f"from {old} to {new} parts along dim {dim}: got {len(got)} pieces")
        for i, (g, w) in enumerate(zip(got, want)):
            if np.shape(g) != w.shape or not np.array_equal(g, w):
                raise Wrong(f"from {old} to {new} parts along dim {dim}: piece {i} has shape {np.shape(g)} "
                            f"and starts {np.ravel(g)[:4]}, expected shape {w.shape} starting {w.ravel()[:4]}")


def bubble(spans):
    """Reference: 1 - busy / (p x makespan) of one pipeline's step.  ``spans``: one list per rank of
    that rank's (start, end) compute intervals."""
    p = len(spans)
    start = min(a for rank in spans for a, _ in rank)
    end = max(b for rank in spans for _, b in rank)
    return pipeline_bubble([(0, 0, 0, start, end, sum(b - a for a, b in rank)) for rank in spans]) if p else 0.0


def check_bubble(f):
    cases = [
        [[(0, 1), (1, 2), (2, 3), (3, 4)], [(1, 2), (2, 3), (3, 4), (4, 5)],
         [(2, 3), (3, 4), (4, 5), (5, 6)], [(3, 4), (4, 5), (5, 6), (6, 7)]],      # 16 busy of 28
        [[(0.0, 2.5)], [(1.0, 2.0), (3.0, 4.0)]],
        [[(0, 1)], [(0, 1)]],
    ]
    for spans in cases:
        got, want = f(spans), bubble(spans)
        if abs(got - want) > 1e-12:
            raise Wrong(f"{len(spans)} ranks {spans}: got {got:.4f}, expected {want:.4f} = 1 - busy / "
                        "(p x makespan), the makespan from the first start to the last end of any rank")


def hidden_share(comm, compute):
    """Reference: the share of the communication intervals' time during which compute ran too."""
    total = _union(comm)
    return _overlap(comm, compute) / total if total else 0.0


def check_hidden_share(f):
    cases = [([(0, 4)], [(1, 2), (3, 5)], 0.5), ([(0, 1), (2, 3)], [(0, 3)], 1.0), ([(0, 2)], [(3, 4)], 0.0),
             ([(0, 4)], [(1, 3), (2, 3.5)], 0.625)]
    for comm, compute, want in cases:
        got = f(comm, compute)
        if abs(got - want) > 1e-12:
            raise Wrong(f"comm {comm}, compute {compute}: got {got:.4f}, expected {want:.4f}"
                        + (" - overlapping compute intervals must count once" if want == 0.625 else ""))
