"""Non-blocking operations that keep their buffers alive, and waiting for them."""
import time

from mpi4py import MPI

from hpcpar.comm import flight


class Request:
    """A pending non-blocking operation, keeping its buffers alive until it completes."""

    flight = None                  # its flight-recorder entry (hpcpar/comm/flight.py), when one is recording

    def __init__(self, mpi_request, keep=(), finish=None, stats=None):
        self.mpi_request = mpi_request
        self._keep = keep          # arrays MPI still reads or writes: must outlive the request
        self._finish = finish      # e.g. copy a staged host buffer back to the device
        self.stats = stats         # where the time blocked in wait() is counted

    def wait(self):
        _waiting([self])
        start = time.perf_counter()
        self.mpi_request.Wait()
        if self.stats is not None:
            self.stats.of["wait"].seconds += time.perf_counter() - start
        self._complete()

    def test(self):
        done = self.mpi_request.Test()
        if done:
            self._complete()
        return done

    def _complete(self):
        rec = flight.active()
        if self.flight is not None and rec is not None:
            rec.end(self.flight)
            self.flight = None
        if self._finish is not None:
            self._finish()
            self._finish = None
        self._keep = ()


def wait_all(requests):
    """Wait for every request (one MPI_Waitall), then run their completions.  The time blocked counts
    as "wait" in the stats of each communicator involved."""
    requests = [r for r in requests if r is not None]
    if requests:
        _waiting(requests)
        start = time.perf_counter()
        MPI.Request.Waitall([r.mpi_request for r in requests])
        blocked = time.perf_counter() - start
        for stats in {id(r.stats): r.stats for r in requests if r.stats is not None}.values():
            stats.of["wait"].seconds += blocked
        for r in requests:
            r._complete()


def test_all(requests):
    """Let MPI progress the pending ``requests`` (one MPI_Testall; completes nothing of ours: wait_all
    still runs their completions).  A non-blocking collective on MPICH advances only inside MPI calls."""
    pending = [r.mpi_request for r in requests if r is not None]
    if pending:
        MPI.Request.Testall(pending)


def _waiting(requests):
    """Tell the flight recorder that this rank now blocks on these requests."""
    rec = flight.active()
    if rec is not None:
        for r in requests:
            if r.flight is not None:
                rec.waiting(r.flight)
