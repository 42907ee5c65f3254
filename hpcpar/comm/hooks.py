"""What may watch a Communicator's calls: the tracer (hpcpar/tracer.py) and the flight recorder
(hpcpar/comm/flight.py).  A plain run has neither: Communicator._blocking then checks two globals and
calls MPI, and nothing here runs.  With either on, these two functions do the call's bookkeeping.

A blocking call is one flight entry from its start to its end and one "comm" span in the trace (the
MPI call itself, its args the bytes this rank hands MPI - an all-to-all's rows, say; staging copies
of device memory have their own spans, staging.py); a non-blocking one (isend, iall_reduce_, ...) is
entered when posted and completed by its Request (requests.py), which also marks when this rank began
to wait for it - a trace shows it when somebody waits for it.
A group of one rank calls nothing and records nothing.
"""
import time

from hpcpar.comm import flight
from hpcpar import tracer as trace


def watching():
    """Whether a tracer or a flight recorder is on.  Read from the two modules' globals directly:
    calling their active() would cost ~100 ns, a few per cent of a 4 KB message."""
    return trace._active is not None or flight._active is not None


def blocking(comm, op, nbytes, peer, count, mpi_call, args):
    """mpi_call(*args), timed into ``count`` (stats.Count), entered in the flight recorder and traced."""
    tracer, rec = trace.active(), flight.active()
    entry = None if rec is None else rec.begin(op, comm.name, peer, nbytes, blocking=True)
    start = time.perf_counter()
    mpi_call(*args)
    end = time.perf_counter()
    count.seconds += end - start
    if tracer is not None:
        tracer.span(f"{comm.name} {op}", "collective", start, end, "comm", bytes=nbytes)
    if entry is not None:
        rec.end(entry)


def posted(comm, op, nbytes, peer, request):
    """A non-blocking call just posted: its flight entry, which ``request`` completes."""
    rec = flight.active()
    if rec is not None:
        request.flight = rec.begin(op, comm.name, peer, nbytes, blocking=False)
