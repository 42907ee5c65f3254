"""Exercises on checkpoints and traces: resharding a tensor, the bubble and the hidden communication
measured from a trace's intervals."""
import numpy as np

from hpcpar.course.wrong import Wrong
from hpcpar.nn.parameter import Shard
from hpcpar.pipeline.bubble import pipeline_bubble
from hpcpar.tools.trace.report import _overlap, _union


def reshard(pieces, dim, new_parts, groups=1):
    """Reference: the pieces of a tensor cut in len(pieces) parts along ``dim``, cut again into
    ``new_parts`` (what loading a checkpoint on another tp does: assemble, then take).  ``groups`` > 1:
    the dimension is ``groups`` blocks side by side (GPT-2's fused [Q | K | V]), each cut separately."""
    old = len(pieces)
    full_shape = list(pieces[0].shape)
    full_shape[dim] *= old
    full = Shard(dim, old, 0, groups).assemble(list(pieces), tuple(full_shape))
    return [Shard(dim, new_parts, i, groups).take(full) for i in range(new_parts)]


def check_reshard(f):
    # 2-D and 3-D tensors, the cut dimension first, last and in the middle, fused groups on each of them
    for shape, dim, old, new, groups in (((4, 12), 1, 2, 4, 1), ((4, 12), 1, 4, 2, 1), ((4, 12), 0, 2, 4, 1),
                                         ((4, 12), 1, 3, 1, 1), ((4, 12), 0, 1, 2, 1), ((4, 12), 1, 2, 4, 3),
                                         ((4, 12), 1, 4, 2, 3), ((4, 12), 1, 1, 2, 3), ((12, 24), 0, 2, 4, 3),
                                         ((2, 12, 24), 1, 4, 2, 3), ((2, 24, 3), 1, 2, 4, 3), ((2, 8, 3), 1, 2, 4, 1)):
        full = np.arange(np.prod(shape), dtype=float).reshape(shape)
        pieces = [Shard(dim, old, i, groups).take(full) for i in range(old)]
        got = f([p.copy() for p in pieces], dim, new, groups)
        want = [Shard(dim, new, i, groups).take(full) for i in range(new)]
        case = f"a {shape} tensor from {old} to {new} parts along dim {dim}" + (f", groups {groups}" if groups > 1 else "")
        if len(got) != new:
            raise Wrong(f"{case}: got {len(got)} pieces")
        for i, (g, w) in enumerate(zip(got, want)):
            if np.shape(g) != w.shape:
                raise Wrong(f"{case}: piece {i} has shape {np.shape(g)}, expected {w.shape}")
            if not np.array_equal(g, w):
                k = int(np.flatnonzero(np.ravel(g) != np.ravel(w))[0])
                raise Wrong(f"{case}: piece {i} differs first at flat index {k}: got {np.ravel(g)[k]:g}, "
                            f"expected {np.ravel(w)[k]:g} (the full tensor holds 0, 1, 2, ... in C order)")


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
        [[(10.0, 11.0), (12.0, 13.0)], [(11.0, 12.0), (13.0, 14.0)]],             # a step that starts at 10
    ]
    for spans in cases:
        got, want = f(spans), bubble(spans)
        if abs(got - want) > 1e-12:
            raise Wrong(f"{len(spans)} ranks {spans}: got {got:.4f}, expected {want:.4f} = 1 - busy / "
                        "(p x makespan), the makespan from the first start to the last end of any rank")


def _merged(intervals):
    """The union of ``intervals`` as sorted, disjoint (start, end) pairs."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def hidden_share(comm, compute):
    """Reference: the share of the time during which some communication ran that some compute ran too
    (a moment counts once, however many intervals of either kind cover it)."""
    total = _union(comm)
    return _overlap(_merged(comm), compute) / total if total else 0.0


def check_hidden_share(f):
    cases = [([(0, 4)], [(1, 2), (3, 5)]), ([(0, 1), (2, 3)], [(0, 3)]), ([(0, 2)], [(3, 4)]),
             ([(0, 4)], [(1, 3), (2, 3.5)]),                    # compute intervals that overlap each other
             ([(0, 2), (1, 3)], [(1, 2)]),                      # communication intervals that overlap
             ([(0, 2), (1, 3), (5, 6)], [(0.5, 1.5), (2.5, 5.5)])]
    for comm, compute in cases:
        got, want = f(comm, compute), hidden_share(comm, compute)
        if abs(got - want) > 1e-12:
            raise Wrong(f"comm {comm}, compute {compute}: got {got:.4f}, expected {want:.4f}")
