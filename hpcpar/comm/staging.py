"""Device arrays through an MPI that cannot read device memory: copies through pinned host buffers.

A pinned (page-locked) host buffer per shape and role, reused across steps, so a step allocates
nothing; every copy is counted in ``bytes`` and shown in a trace as a "staging" span.
"""
import time

from hpcpar import tracer as trace


class Staging:
    """Pinned host buffers for device arrays when MPI is not CUDA-aware, reused by (dtype, size)."""

    def __init__(self):
        self._buffers = {}
        self.bytes = 0    # bytes moved between device and host for MPI's sake

    def host(self, x, slot):
        import cupyx
        key = (slot, x.dtype.str, x.size)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = cupyx.empty_pinned((x.size,), dtype=x.dtype)
        return buf.reshape(x.shape)

    def down(self, x, slot):
        """Device -> host copy of ``x`` into a staging buffer."""
        start = time.perf_counter()
        h = self.host(x, slot)
        x.get(out=h)
        self._account("staging d2h", start, x.nbytes)
        return h

    def up(self, h, x):
        """Host -> device copy back into ``x``."""
        start = time.perf_counter()
        x.set(h)
        self._account("staging h2d", start, x.nbytes)

    def _account(self, what, start, nbytes):
        self.bytes += nbytes
        tracer = trace.active()
        if tracer is not None:                  # the trace shows staging apart from the MPI call
            tracer.span(what, "staging", start, time.perf_counter(), "comm", bytes=nbytes)
