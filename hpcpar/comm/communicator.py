"""Communicator: counted, buffer-based collectives and point-to-point calls (see hpcpar/comm/__init__.py)."""
import functools
import time

import numpy as np
from mpi4py import MPI

from hpcpar import backend, flight, trace
from hpcpar.comm.device import cuda_aware_mpi
from hpcpar.comm.recorded import recorded
from hpcpar.comm.requests import Request, Stats, timed
from hpcpar.comm.staging import Staging

OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


@functools.lru_cache(maxsize=None)
def _is_bfloat16(dtype):
    """Remembered per dtype: numpy computes ``dtype.name`` anew each time, in microseconds - as long as
    a small message takes."""
    return dtype.name == "bfloat16"


def _wire(x):
    """What MPI is handed for x: x itself, or for bfloat16 (no MPI datatype) its bytes as uint16 -
    fine for moving data, never for summing it (see _summable)."""
    return x.view(np.uint16) if _is_bfloat16(x.dtype) else x


def _summable(x):
    if x is not MPI.IN_PLACE and _is_bfloat16(x.dtype):
        raise TypeError("MPI cannot reduce bfloat16: sum low precision in float32 (hpcpar.precision)")


def _traced(op):
    """Record the call as a "comm" span when tracing is on (hpcpar/trace.py); size-1 groups are free.

    Over a method that ``recorded`` wraps: with neither the tracer nor the flight recorder on, the call
    goes straight to the method beneath both hooks - each wrapper layer costs a fraction of a
    microsecond, and a small message takes only a few."""
    def wrap(method):
        bare = getattr(method, "__wrapped__", method)

        @functools.wraps(method)
        def call(self, *args, **kwargs):
            tracer = trace.active()
            if tracer is None or self.size == 1:
                if flight.active() is None:
                    return bare(self, *args, **kwargs)
                return method(self, *args, **kwargs)
            start = time.perf_counter()
            out = method(self, *args, **kwargs)
            tracer.span(f"{self.name} {op}", "collective", start, time.perf_counter(), "comm")
            return out
        return call
    return wrap


class Communicator:
    """An MPI communicator with counted, buffer-based collectives and point-to-point calls."""

    def __init__(self, mpi_comm, name="comm"):
        self.mpi = mpi_comm
        self.name = name
        self.rank = mpi_comm.rank
        self.size = mpi_comm.size
        self.stats = Stats()
        self._staging = None
        self._cuda_aware = None

    # --- buffers ------------------------------------------------------------------------------

    def _contiguous(self, x):
        if x.flags.c_contiguous:
            return x
        self.stats.add("copy", x.nbytes)
        return backend.array_module(x).ascontiguousarray(x)

    @staticmethod
    def _require_contiguous(x, what):
        if not x.flags.c_contiguous:
            raise ValueError(f"{what} must be a C-contiguous array (got strides {x.strides})")

    def _device(self, x):
        """None for host arrays; else whether x may be passed to MPI directly (CUDA-aware)."""
        if not backend.is_device_array(x):
            return None
        if self._cuda_aware is None:
            self._cuda_aware = cuda_aware_mpi()
            self._staging = Staging()
        import cupy
        cupy.cuda.get_current_stream().synchronize()   # MPI must see finished kernels
        return self._cuda_aware

    def _in(self, x, slot):
        """A buffer MPI may read that holds x's values."""
        if type(x) is np.ndarray:                       # host memory: the common case, decided at once
            return _wire(x)
        if self._device(x) is False:
            return _wire(self._staging.down(x, slot))
        return _wire(x)

    def _out(self, y, slot):
        """(buffer MPI may write, function that moves it into y afterwards)."""
        if type(y) is np.ndarray:
            return _wire(y), None
        if self._device(y) is False:
            h = self._staging.host(y, slot)
            return _wire(h), (lambda: self._staging.up(h, y))
        return _wire(y), None

    @property
    def staging_bytes(self):
        return self._staging.bytes if self._staging else 0

    # --- collectives --------------------------------------------------------------------------

    @_traced("all_reduce")
    @recorded("all_reduce")
    def all_reduce(self, x, op="sum"):
        """Elementwise reduction over the group; a new array (x itself when size is 1)."""
        if self.size == 1:
            return x
        x = self._contiguous(x)
        y = backend.array_module(x).empty_like(x)
        return self._all_reduce(x, y, op)

    @_traced("all_reduce")
    @recorded("all_reduce")
    def all_reduce_(self, x, op="sum"):
        """In-place all-reduce of a contiguous array."""
        self._require_contiguous(x, "all_reduce_ target")
        if self.size == 1:
            return x
        return self._all_reduce(MPI.IN_PLACE, x, op)

    def _all_reduce(self, x, y, op):
        _summable(y)
        self.stats.add("all_reduce", y.nbytes)
        send = x if x is MPI.IN_PLACE else self._in(x, "send")
        recv, finish = self._out(y, "recv")
        if send is MPI.IN_PLACE and finish:                 # staged: the host buffer starts with y
            self._staging.down(y, "recv")
        timed(self.stats, "all_reduce", self.mpi.Allreduce, send, recv, op=OPS[op])
        if finish:
            finish()
        return y

    @_traced("iall_reduce (start)")
    @recorded("all_reduce", posts=True)
    def iall_reduce_(self, x, op="sum"):
        """Start an in-place all-reduce of a contiguous array; returns a Request (or None if size 1)."""
        self._require_contiguous(x, "iall_reduce_ target")
        if self.size == 1:
            return None
        _summable(x)
        self.stats.add("all_reduce", x.nbytes)
        recv, finish = self._out(x, "iall_reduce")
        if finish:
            self._staging.down(x, "iall_reduce")
        return Request(self.mpi.Iallreduce(MPI.IN_PLACE, recv, op=OPS[op]), (x, recv), finish, self.stats)

    @_traced("all_gather")
    @recorded("all_gather")
    def all_gather(self, x, axis=0, out=None):
        """Concatenate every rank's x along ``axis`` (same shape on every rank).  ``out``: a contiguous
        array of the result's shape to gather into (axis 0 only), reused from call to call - a fresh
        output's pages cost the kernel about as much as the copy itself at tens of MB."""
        if out is not None:
            self._require_contiguous(out, "all_gather output")
            if axis or out.shape != (self.size * x.shape[0],) + x.shape[1:]:
                raise ValueError(f"all_gather: out must have shape {(self.size * x.shape[0],) + x.shape[1:]} "
                                 f"and axis be 0 (got {out.shape}, axis {axis})")
        if self.size == 1:
            if out is None:
                return x
            out[...] = x
            return out
        m = backend.array_module(x)
        x = self._contiguous(x)
        self.stats.add("all_gather", x.nbytes)
        y = m.empty((self.size,) + x.shape, dtype=x.dtype) if out is None else \
            out.reshape((self.size,) + x.shape)                    # (size, *x.shape)
        recv, finish = self._out(y, "gather")
        timed(self.stats, "all_gather", self.mpi.Allgather, self._in(x, "send"), recv)
        if finish:
            finish()
        if out is not None:
            return out
        # (size, ..., n, ...) -> (..., size * n, ...): bring the rank axis next to `axis` and merge
        # (along axis 0 it already is: skip moveaxis, which costs microseconds in Python)
        if axis:
            y = m.moveaxis(y, 0, axis)
        shape = x.shape[:axis] + (self.size * x.shape[axis],) + x.shape[axis + 1:]
        return y.reshape(shape)

    @_traced("reduce_scatter")
    @recorded("reduce_scatter")
    def reduce_scatter(self, x, axis=0, op="sum"):
        """Sum over ranks, then rank i keeps the i-th of ``size`` equal slices along ``axis``."""
        if self.size == 1:
            return x
        n = x.shape[axis]
        if n % self.size:
            raise ValueError(f"reduce_scatter: dimension {axis} of length {n} is not divisible "
                             f"by the group size {self.size}")
        _summable(x)
        m = backend.array_module(x)
        # (..., size * k, ...) -> (size, ..., k, ...), contiguous, so each rank's block is one run
        # (along axis 0 the blocks already are: only the contiguity check is left)
        if axis:
            blocks = m.ascontiguousarray(m.moveaxis(
                x.reshape(x.shape[:axis] + (self.size, n // self.size) + x.shape[axis + 1:]), axis, 0))
        else:
            blocks = self._contiguous(x).reshape((self.size, n // self.size) + x.shape[1:])
        self.stats.add("reduce_scatter", blocks.nbytes)
        y = m.empty(blocks.shape[1:], dtype=x.dtype)
        recv, finish = self._out(y, "scatter")
        timed(self.stats, "reduce_scatter", self.mpi.Reduce_scatter_block, self._in(blocks, "send"), recv,
              op=OPS[op])
        if finish:
            finish()
        return y

    @_traced("ireduce_scatter (start)")
    @recorded("reduce_scatter", posts=True)
    def ireduce_scatter(self, x, y, op="sum"):
        """Start a reduce-scatter of flat x (size * len(y)) into flat y; returns a Request."""
        self._require_contiguous(x, "ireduce_scatter input")
        self._require_contiguous(y, "ireduce_scatter output")
        if x.size != y.size * self.size:
            raise ValueError(f"ireduce_scatter: input of {x.size} elements is not {self.size} x {y.size}")
        if self.size == 1:
            y[...] = x
            return None
        _summable(x)
        self.stats.add("reduce_scatter", x.nbytes)
        recv, finish = self._out(y, "ireduce_scatter")
        send = self._in(x, "ireduce_scatter_in")
        return Request(self.mpi.Ireduce_scatter_block(send, recv, op=OPS[op]), (x, y, send, recv), finish,
                       self.stats)

    @_traced("iall_gather (start)")
    @recorded("all_gather", posts=True)
    def iall_gather_(self, y):
        """Start an in-place all-gather of flat y: rank i's block y[i*k:(i+1)*k] (k = len(y) / size) is
        already in place and every block is filled in on completion. Returns a Request."""
        self._require_contiguous(y, "iall_gather_ buffer")
        if y.size % self.size:
            raise ValueError(f"iall_gather_: {y.size} elements do not split into {self.size} blocks")
        if self.size == 1:
            return None
        self.stats.add("all_gather", y.nbytes // self.size)
        recv, finish = self._out(y, "iall_gather")
        if finish:
            self._staging.down(y, "iall_gather")
        return Request(self.mpi.Iallgather(MPI.IN_PLACE, recv), (y, recv), finish, self.stats)

    @_traced("bcast")
    @recorded("bcast")
    def bcast_(self, x, root=0):
        """In-place broadcast of a contiguous array from ``root``."""
        self._require_contiguous(x, "bcast_ target")
        if self.size == 1:
            return x
        self.stats.add("bcast", x.nbytes)
        buf, finish = self._out(x, "bcast")
        if finish and self.rank == root:
            self._staging.down(x, "bcast")
        timed(self.stats, "bcast", self.mpi.Bcast, buf, root=root)
        if finish:
            finish()
        return x

    @recorded("barrier")
    def barrier(self):
        timed(self.stats, "barrier", self.mpi.Barrier)

    # --- point to point -----------------------------------------------------------------------

    @_traced("send")
    @recorded("send", (1, "dest"))
    def send(self, x, dest, tag=0):
        x = self._contiguous(x)
        self.stats.add("send", x.nbytes)
        timed(self.stats, "send", self.mpi.Send, self._in(x, "p2p_send"), dest=dest, tag=tag)

    @_traced("recv")
    @recorded("recv", (1, "source"))
    def recv_(self, out, source, tag=0):
        """Receive into ``out`` (contiguous, of the sender's shape and dtype)."""
        self._require_contiguous(out, "receive buffer")
        self.stats.add("recv", out.nbytes)
        buf, finish = self._out(out, "p2p_recv")
        timed(self.stats, "recv", self.mpi.Recv, buf, source=source, tag=tag)
        if finish:
            finish()
        return out

    @recorded("send", (1, "dest"), posts=True)
    def isend(self, x, dest, tag=0):
        """Start sending x; the Request keeps x alive until it completes (do not modify x before)."""
        x = self._contiguous(x)
        self.stats.add("send", x.nbytes)
        buf = self._in(x, ("isend", dest, tag))
        return Request(self.mpi.Isend(buf, dest=dest, tag=tag), (x, buf), stats=self.stats)

    @recorded("recv", (1, "source"), posts=True)
    def irecv_(self, out, source, tag=0):
        """Post a receive into ``out``; its values are valid after the Request's wait()."""
        self._require_contiguous(out, "receive buffer")
        self.stats.add("recv", out.nbytes)
        buf, finish = self._out(out, ("irecv", source, tag))
        return Request(self.mpi.Irecv(buf, source=source, tag=tag), (out, buf), finish, self.stats)

    @_traced("sendrecv")
    @recorded("sendrecv", (1, "dest"))
    def sendrecv(self, x, dest, out, source, tag=0):
        """Send x to ``dest`` and receive ``out`` from ``source`` in one deadlock-free call."""
        x = self._contiguous(x)
        self._require_contiguous(out, "receive buffer")
        self.stats.add("send", x.nbytes)
        self.stats.add("recv", out.nbytes)
        buf, finish = self._out(out, "sendrecv")
        timed(self.stats, "sendrecv", self.mpi.Sendrecv, self._in(x, "sendrecv_send"), dest=dest, sendtag=tag,
              recvbuf=buf, source=source, recvtag=tag)
        if finish:
            finish()
        return out
