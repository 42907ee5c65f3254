"""The collectives primer (docs/collectives.md): the alpha-beta formulas, and the 4-rank demonstration
of every pattern run on real MPI ranks."""
import numpy as np
import pytest

from hpcpar.course.collectives import COLLECTIVES, bytes_sent_per_rank, cost


def test_ring_allreduce_is_a_reduce_scatter_then_an_all_gather():
    for p in (2, 4, 8, 64):
        n, alpha, beta = 1 << 20, 5e-6, 1e-10
        both = cost("reduce-scatter", n, p, alpha, beta) + cost("all-gather", n, p, alpha, beta)
        assert cost("all-reduce", n, p, alpha, beta) == pytest.approx(both, rel=1e-12)
    # its bandwidth term stays below 2 n beta however many ranks share the sum
    assert [bytes_sent_per_rank("all-reduce", 1000, p) for p in (2, 4, 1000)] == [1000, 1500, 1998]
    assert cost("broadcast", 1000, 8, 1.0, 0.0) == 3.0          # log2 8 tree levels of latency
    assert cost("all-reduce", 1000, 1, 1.0, 1.0) == 0.0


@pytest.mark.mpi(min_size=4)
def test_every_pattern_on_four_ranks(comm):
    from mpi4py import MPI

    from hpcpar.examples.collectives import expected, run_pattern
    four = comm.Split(0 if comm.rank < 4 else MPI.UNDEFINED, comm.rank)
    if four == MPI.COMM_NULL:
        return
    try:
        for name in COLLECTIVES:
            _, after = run_pattern(four, name)
            # exact: sums of small integers in float64
            assert np.array_equal(after, expected(name, four.rank, four.size)), name
    finally:
        four.Free()
