"""Thin, counted wrappers over mpi4py's buffer-based calls.

Every hot-path message goes through the uppercase mpi4py methods (``Allreduce``, ``Send``, ...),
which hand MPI a pointer to contiguous memory - no pickling.  The wrappers add exactly four things:

1. **Safety**: a non-contiguous input is copied to a contiguous one (and counted as a copy); an
   in-place target or receive buffer that is not contiguous is refused.  Never silently wrong.
2. **Counters**: calls, payload bytes and seconds blocked per operation and communicator (``stats``).
   "Payload" is what this rank hands to MPI (for an all-gather its own part, for a reduce-scatter the
   whole input); what a ring algorithm puts on the wire is derived in docs/performance.md.  "Blocked"
   is the wall time spent inside a blocking MPI call, or waiting for a non-blocking one to complete
   (under "wait"): the communication time a rank could not hide behind computation.
3. **Device buffers**: a cupy array goes to MPI as it is when MPI is CUDA-aware (after synchronising
   the current stream, so MPI reads finished data); otherwise it is staged through a pinned host
   buffer that is reused across steps.
4. **Flight recording**: when a flight recorder is installed (``hpcpar train`` does it), each call
   is entered in its ring buffer - operation, group, the group's collective number or the peer,
   bytes, start, wait and end - so that a hung job can say who waited for whom (hpcpar/comm/flight.py).

A communicator of size 1 is a no-op for every collective (nothing is counted, nothing is copied).

communicator.py   Communicator: the collectives
point_to_point.py its point-to-point calls (send, receive, non-blocking, send-receive)
stats.py          Stats: the counters of calls, bytes and seconds per operation
requests.py       Request, wait_all and test_all (non-blocking operations)
staging.py        pinned host buffers for device arrays when MPI is not CUDA-aware
buffers.py        what MPI is handed: the array itself, bfloat16 as uint16, device memory staged
hooks.py          what the tracer and the flight recorder see of each call, when they are on
device.py         one GPU per rank (select_device) and whether MPI is CUDA-aware
grid.py           the rank grid: an ordered list of axes, the groups along any of them
placement.py      where the grid's ranks sit on nodes
flight.py         the flight recorder: each rank's last calls, read back when a job hangs
"""
import importlib

# Importing mpi4py.MPI starts MPI, and a rank must fork its guard (watch/rank_guard.py) before that:
# so the names below load their module on first use (PEP 562), and the grid, the placement and the
# flight recorder - pure Python - can be imported before MPI starts.
_HOME = {"OPS": "communicator", "Communicator": "communicator", "Request": "requests",
         "test_all": "requests", "wait_all": "requests", "Stats": "stats"}
__all__ = sorted(_HOME)


def __getattr__(name):
    if name not in _HOME:
        raise AttributeError(f"module 'hpcpar.comm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hpcpar.comm.{_HOME[name]}"), name)
