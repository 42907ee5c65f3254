"""A quick end-to-end check of the grid and the communication layer on a running job.

Every collective is checked against numpy on data every rank can compute for itself (rank r holds
values derived from r), so a wrong wrapper, a wrong group or a wrong rank order shows up as a
mismatch, with the communicator and operation named.
"""
import numpy as np

from hpcpar.comm import wait_all


def _local(comm_rank, shape, dtype, salt):
    """Deterministic per-rank data: what rank ``comm_rank`` of a group contributes."""
    return np.random.default_rng([salt, comm_rank]).standard_normal(shape).astype(dtype)


def check_communicator(comm, dtype=np.float64, n=1001):
    """Run each wrapper on ``comm`` and compare with numpy; returns a list of failure strings."""
    fails = []
    parts = [_local(r, (n,), dtype, 1) for r in range(comm.size)]
    tol = 1e-12 if dtype == np.float64 else 1e-5

    def expect(name, got, want):
        if got.shape != want.shape or not np.allclose(got, want, rtol=tol, atol=tol):
            fails.append(f"{comm.name}: {name} differs from numpy")

    x = parts[comm.rank]
    expect("all_reduce", comm.all_reduce(x), np.sum(parts, axis=0))
    expect("all_reduce max", comm.all_reduce(x, op="max"), np.max(parts, axis=0))
    expect("all_gather", comm.all_gather(x), np.concatenate(parts))
    m = comm.size * 3
    blocks = [_local(r, (m, 5), dtype, 2) for r in range(comm.size)]
    expect("reduce_scatter", comm.reduce_scatter(blocks[comm.rank]),
           np.split(np.sum(blocks, axis=0), comm.size)[comm.rank])
    b = x.copy() if comm.rank == 0 else np.zeros_like(x)
    expect("bcast", comm.bcast_(b), parts[0])
    # ring: send to the right, receive from the left, with non-blocking calls posted receive-first
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    out = np.empty_like(x)
    wait_all([comm.irecv_(out, left, tag=7), comm.isend(x, right, tag=7)])
    expect("ring isend/irecv", out, parts[left])
    return fails


def run(grid):
    """Check every communicator of ``grid``; returns (failures, per-communicator byte counts)."""
    fails = []
    for comm in grid.communicators():
        for dtype in (np.float32, np.float64):
            fails += check_communicator(comm, dtype)
    return fails, {c.name: c.stats.total_bytes() for c in grid.communicators()}
