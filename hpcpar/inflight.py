"""Communication in flight, moved on from inside the forward and backward passes: the poll.

(Named for what it serves, the messages in flight; the progress bar of a run is training/loop.py's.)

MPICH moves a non-blocking collective on only while the rank is inside an MPI call, and an
``Iallreduce`` needs several such calls to finish (one per round of its algorithm: a 4 MB bucket
takes 5 or 6 at two ranks, docs/performance.md).  A backward pass that enters MPI once per layer
leaves the buckets waiting for tens of milliseconds between rounds.  So the modules call ``poll()``
after each of their large GEMMs, and whoever has operations in flight (data parallelism, for the
gradient buckets; ZeRO-3 for its prefetched all-gathers, which the forward must move too, and its
reduce-scatters) installs what a poll does - one ``MPI_Testall``.

With nothing installed ``poll()`` is one global lookup: the single-rank model pays nothing.
"""
_hook = None       # a function of no arguments, or None


def poll():
    """Give the communication in flight a chance to progress (a no-op when none is)."""
    if _hook is not None:
        _hook()


def install(hook):
    """``hook``: what a poll calls from now on; None: polls do nothing again."""
    global _hook
    _hook = hook
