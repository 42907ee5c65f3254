"""Helpers shared by the examples: printing rank by rank, and formatting small arrays."""
import sys

import numpy as np


def vec(a):
    """A small array as a tuple of numbers: (6, 8), or ((1, 2), (5, 6)) for a matrix."""
    a = np.asarray(a)
    while a.ndim > 1 and a.shape[0] == 1:          # a batch of one row prints as that row
        a = a[0]
    if a.ndim <= 1:
        return "(" + ", ".join(f"{float(v):g}" for v in a.ravel()) + ")"
    return "(" + ", ".join(vec(row) for row in a) + ")"


def rank_by_rank(comm, lines):
    """Print every rank's ``lines`` on rank 0, in rank order, each prefixed by its rank.  Collective."""
    everyone = comm.gather(lines, root=0)          # a handful of strings: pickled gather is fine
    if comm.rank == 0:
        for r, mine in enumerate(everyone):
            for line in mine:
                print(f"rank {r}: {line}")
        sys.stdout.flush()


def once(comm, text=""):
    """Print on rank 0 only."""
    if comm.rank == 0:
        print(text, flush=True)


def require_size(comm, n, module):
    from hpcpar.runtime import UsageError
    if comm.size != n:
        raise UsageError(f"run this example on {n} ranks: mpiexec -n {n} python -m hpcpar.examples.{module}")


def traffic(comm, before):
    """Collective calls made on ``comm`` since the snapshot ``before``, as 'all_gather x1 (32 B)'."""
    now = {op: (comm.stats.calls[op], comm.stats.bytes[op]) for op in comm.stats.calls}
    parts = [f"{op} x{n - before.get(op, (0, 0))[0]} ({b - before.get(op, (0, 0))[1]} B)"
             for op, (n, b) in sorted(now.items()) if n > before.get(op, (0, 0))[0]]
    return ", ".join(parts) or "none"


def snapshot(comm):
    return {op: (comm.stats.calls[op], comm.stats.bytes[op]) for op in comm.stats.calls}
