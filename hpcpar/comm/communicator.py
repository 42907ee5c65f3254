"""Communicator: counted, buffer-based collectives and point-to-point calls (see hpcpar/comm/__init__.py).

Every call does the same few things and, on the common path, nothing more: refuse (or copy and
count) a buffer that is not contiguous; return at once in a group of one rank; hand MPI the array
itself (buffers.py: bfloat16 and device memory take a detour); and call MPI through one of three
doors: ``_blocking`` (count, time, and only when a tracer or flight recorder is on, the hooks of
hooks.py), ``_collective`` (a blocking collective: its buffers, then ``_blocking``) and ``_posted``
(a non-blocking call).  A 4 KB message spends ~3.5 us inside MPI, so every step here is written to
cost tens of nanoseconds: no decorator around the methods (a call through a wrapper's ``*args,
**kwargs`` costs ~0.2 us), counters updated in place, one set lookup for the buffers.
"""
import math
import time
from itertools import accumulate

import numpy as np
from mpi4py import MPI

from hpcpar import backend
from hpcpar.comm import flight
from hpcpar import tracer as trace
from hpcpar.comm import hooks
from hpcpar.comm.buffers import IN_PLACE, Buffers
from hpcpar.comm.point_to_point import PointToPoint, refuse_strided
from hpcpar.comm.requests import Request
from hpcpar.comm.stats import Stats

OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
perf_counter = time.perf_counter


class Communicator(PointToPoint):
    """An MPI communicator with counted, buffer-based collectives and point-to-point calls (those:
    point_to_point.py)."""

    def __init__(self, mpi_comm, name="comm"):
        self.mpi = mpi_comm
        self.name = name
        self.rank = mpi_comm.rank
        self.size = mpi_comm.size
        self.stats = Stats()
        self.buffers = Buffers()

    def _copy(self, x):
        """A contiguous copy of x (counted): MPI needs one run of memory."""
        self.stats.add("copy", x.nbytes)
        return backend.array_module(x).ascontiguousarray(x)

    @property
    def staging_bytes(self):
        staging = self.buffers.staging
        return staging.bytes if staging else 0

    # --- the ways into MPI --------------------------------------------------------------------

    def _blocking(self, op, nbytes, peer, mpi_call, args):
        """mpi_call(*args), counted and timed (and recorded when a tracer or flight recorder is on).
        ``peer``: the other rank of a point-to-point call, None for a collective.  ``args`` come as
        one tuple: a call spelled ``f(a, b, *rest)`` builds a list first (~0.1 us)."""
        count = self.stats.of[op]
        count.calls += 1
        count.bytes += nbytes
        if trace._active is None and flight._active is None:      # hooks.watching(), inlined
            start = perf_counter()
            mpi_call(*args)
            count.seconds += perf_counter() - start
        else:
            hooks.blocking(self, op, nbytes, peer, count, mpi_call, args)

    def _collective(self, op, mpi_call, x, y, reduce_op=None):
        """The blocking collective mpi_call(x, y) - mpi_call(x, y, reduce_op) for a reduction - from x
        (or IN_PLACE) into y: buffers, then _blocking, then the copy back of a staged output.  Returns y."""
        send, recv, finish = self.buffers.pair(x, y, op, reduce_op is not None)
        self._blocking(op, y.nbytes if x is IN_PLACE else x.nbytes, None, mpi_call,
                       (send, recv) if reduce_op is None else (send, recv, reduce_op))
        if finish:
            finish()
        return y

    def _posted(self, op, nbytes, peer, request):
        """A non-blocking call just started, counted; its Request (waited for later) is returned."""
        self.stats.add(op, nbytes)
        if hooks.watching():
            hooks.posted(self, op, nbytes, peer, request)
        return request

    # --- collectives --------------------------------------------------------------------------

    def all_reduce(self, x, op="sum", out=None):
        """Elementwise reduction over the group, into ``out`` (contiguous, x's shape and dtype) when
        given, else into a new array (x itself when size is 1)."""
        if out is not None and not out.flags.c_contiguous:
            refuse_strided(out, "all_reduce output")
        if self.size == 1:
            if out is None:
                return x
            out[...] = x
            return out
        if out is x:                                    # MPI may not read and write one buffer
            return self.all_reduce_(x, op)
        if not x.flags.c_contiguous:
            x = self._copy(x)
        y = backend.array_module(x).empty_like(x) if out is None else out
        return self._collective("all_reduce", self.mpi.Allreduce, x, y, OPS[op])

    def all_reduce_(self, x, op="sum"):
        """In-place all-reduce of a contiguous array."""
        if not x.flags.c_contiguous:
            refuse_strided(x, "all_reduce_ target")
        if self.size == 1:
            return x
        return self._collective("all_reduce", self.mpi.Allreduce, IN_PLACE, x, OPS[op])

    def iall_reduce_(self, x, op="sum"):
        """Start an in-place all-reduce of a contiguous array; returns a Request (or None if size 1)."""
        if not x.flags.c_contiguous:
            refuse_strided(x, "iall_reduce_ target")
        if self.size == 1:
            return None
        _, buf, finish = self.buffers.pair(IN_PLACE, x, "iall_reduce_", summed=True)
        return self._posted("all_reduce", x.nbytes, None,
                            Request(self.mpi.Iallreduce(IN_PLACE, buf, OPS[op]), (x, buf), finish, self.stats))

    def all_gather(self, x, axis=0, out=None):
        """Concatenate every rank's x along ``axis`` (same shape on every rank).  ``out``: a contiguous
        array of x's dtype and ``size * x.size`` elements to gather into (axis 0 only; the values land
        in it in C order, whatever its shape), reused from call to call - a fresh output's pages cost
        the kernel about as much as the copy itself at tens of MB."""
        if out is not None and (axis or out.size != self.size * x.size or not out.flags.c_contiguous
                                or (out.dtype is not x.dtype and out.dtype != x.dtype)):
            # (mpi4py compares the reductions' two buffers, not an all-gather's: the dtype is ours to check)
            raise ValueError(f"all_gather: out must be a contiguous {x.dtype} array of {self.size * x.size} "
                             f"elements and axis be 0 (got {out.dtype}, {out.size} elements, axis {axis})")
        if self.size == 1:
            if out is None:
                return x
            out.reshape(x.shape)[...] = x                    # out is contiguous: reshaped, a view
            return out
        if not x.flags.c_contiguous:
            x = self._copy(x)
        if out is None:          # along axis 0 the blocks arrive in place; else (size, *x.shape), moved below
            shape = (self.size * x.shape[0],) + x.shape[1:] if axis == 0 else (self.size,) + x.shape
            out = backend.array_module(x).empty(shape, x.dtype)
        self._collective("all_gather", self.mpi.Allgather, x, out)
        if axis == 0:
            return out
        # (size, ..., n, ...) -> (..., size * n, ...): bring the rank axis next to `axis` and merge
        y = backend.array_module(out).moveaxis(out, 0, axis)
        return y.reshape(x.shape[:axis] + (self.size * x.shape[axis],) + x.shape[axis + 1:])

    def reduce_scatter(self, x, axis=0, op="sum", out=None):
        """Sum over ranks, then rank i keeps the i-th of ``size`` equal slices along ``axis``; into
        ``out`` (contiguous, of x.size / size elements, which mpi4py checks with the dtype; axis 0
        only) when given."""
        n = x.shape[axis]
        if out is not None and (axis or out.size * self.size != x.size or not out.flags.c_contiguous):
            raise ValueError(f"reduce_scatter: out must be a contiguous array of {x.size // self.size} elements "
                             f"and axis be 0 (got {out.size} elements, axis {axis})")
        if self.size == 1:
            if out is None:
                return x
            out[...] = x
            return out
        if n % self.size:
            raise ValueError(f"reduce_scatter: dimension {axis} of length {n} is not divisible "
                             f"by the group size {self.size}")
        if axis:     # (..., size * k, ...) -> (size, ..., k, ...), contiguous: each rank's block is one run
            m = backend.array_module(x)
            x = m.ascontiguousarray(m.moveaxis(
                x.reshape(x.shape[:axis] + (self.size, n // self.size) + x.shape[axis + 1:]), axis, 0))
            y = m.empty(x.shape[1:], dtype=x.dtype)
        else:        # along axis 0 the blocks already are
            if not x.flags.c_contiguous:
                x = self._copy(x)
            y = backend.array_module(x).empty((n // self.size,) + x.shape[1:], x.dtype) if out is None \
                else out
        return self._collective("reduce_scatter", self.mpi.Reduce_scatter_block, x, y, OPS[op])

    def ireduce_scatter(self, x, y, op="sum"):
        """Start a reduce-scatter of flat x (size * len(y)) into flat y; returns a Request."""
        if not x.flags.c_contiguous:
            refuse_strided(x, "ireduce_scatter input")
        if not y.flags.c_contiguous:
            refuse_strided(y, "ireduce_scatter output")
        if x.size != y.size * self.size:
            raise ValueError(f"ireduce_scatter: input of {x.size} elements is not {self.size} x {y.size}")
        if self.size == 1:
            y[...] = x
            return None
        send, recv, finish = self.buffers.pair(x, y, "ireduce_scatter", summed=True)
        return self._posted("reduce_scatter", x.nbytes, None, Request(
            self.mpi.Ireduce_scatter_block(send, recv, OPS[op]), (x, y, send, recv), finish, self.stats))

    def iall_gather_(self, y):
        """Start an in-place all-gather of flat y: rank i's block y[i*k:(i+1)*k] (k = len(y) / size) is
        already in place and every block is filled in on completion. Returns a Request."""
        if not y.flags.c_contiguous:
            refuse_strided(y, "iall_gather_ buffer")
        if y.size % self.size:
            raise ValueError(f"iall_gather_: {y.size} elements do not split into {self.size} blocks")
        if self.size == 1:
            return None
        _, buf, finish = self.buffers.pair(IN_PLACE, y, "iall_gather_")
        return self._posted("all_gather", y.nbytes // self.size, None,
                            Request(self.mpi.Iallgather(IN_PLACE, buf), (y, buf), finish, self.stats))

    def all_to_all(self, x, out=None):
        """Rank i's j-th block of x (``size`` equal blocks along axis 0) goes to rank j, which keeps it as
        the i-th block of the result: a transpose of (rank, block) over the group, x's shape on every
        rank.  ``out``: a contiguous array of x's shape and dtype to receive into."""
        if x.shape[0] % self.size:
            raise ValueError(f"all_to_all: dimension 0 of length {x.shape[0]} is not divisible by the group "
                             f"size {self.size}")
        return self._to_all("all_to_all", x, x.shape, out, self._all_to_all)

    def _all_to_all(self, x, y):
        return self._collective("all_to_all", self.mpi.Alltoall, x, y)

    def all_to_allv(self, x, send_counts, recv_counts=None, out=None):
        """Rank i sends ``send_counts[j]`` consecutive rows of x (along axis 0, in rank order) to rank j;
        the result holds the rows from rank 0, then rank 1, ...: ``recv_counts[j]`` from rank j.  Unknown
        ``recv_counts`` (None) are learnt first by an all_to_all of the counts (one more, small, call).
        ``out``: a contiguous array of x's dtype and (sum(recv_counts), *x.shape[1:]) to receive into."""
        # the counts as Python ints: for a few ranks, list arithmetic costs a third of numpy's on tiny arrays
        send_counts = np.asarray(send_counts).tolist()
        if len(send_counts) != self.size or min(send_counts) < 0 or sum(send_counts) != x.shape[0]:
            raise ValueError(f"all_to_allv: send_counts must be {self.size} non-negative row counts adding up "
                             f"to the {x.shape[0]} rows of x (got {send_counts})")
        if recv_counts is None:
            recv_counts = self.all_to_all(np.array(send_counts, dtype=np.int64))
        recv_counts = np.asarray(recv_counts).tolist()

        def exchange(x, y):
            row = math.prod(x.shape[1:])                    # MPI counts elements: rows x elements per row
            sends, recvs = [c * row for c in send_counts], [c * row for c in recv_counts]
            starts = [0, *accumulate(sends)][:-1], [0, *accumulate(recvs)][:-1]   # each rank's first element
            send, recv, finish = self.buffers.pair(x, y, "all_to_allv")
            self._blocking("all_to_allv", x.nbytes, None, self.mpi.Alltoallv,
                           ([send, (sends, starts[0])], [recv, (recvs, starts[1])]))
            if finish:
                finish()
            return y
        return self._to_all("all_to_allv", x, (sum(recv_counts),) + x.shape[1:], out, exchange)

    def _to_all(self, op, x, shape, out, exchange):
        """What the all-to-alls share around ``exchange(x, y)``: ``out`` checked (contiguous, x's dtype,
        ``shape``) or made, a group of one answered at once, a strided x copied."""
        if out is not None and (out.shape != shape or out.dtype != x.dtype or not out.flags.c_contiguous):
            raise ValueError(f"{op}: out must be a contiguous {x.dtype} array of shape {shape} "
                             f"(got {out.dtype}, {out.shape})")
        if self.size == 1:
            if out is None:
                return x
            out[...] = x
            return out
        if not x.flags.c_contiguous:
            x = self._copy(x)
        return exchange(x, backend.array_module(x).empty(shape, x.dtype) if out is None else out)

    def bcast_(self, x, root=0):
        """In-place broadcast of a contiguous array from ``root``."""
        if not x.flags.c_contiguous:
            refuse_strided(x, "bcast_ target")
        if self.size == 1:
            return x
        buf, finish = self.buffers.writing(x, "bcast")
        if finish and self.rank == root:
            self.buffers.staging.down(x, "bcast")
        self._blocking("bcast", x.nbytes, None, self.mpi.Bcast, (buf, root))
        if finish:
            finish()
        return x

    def barrier(self):
        if self.size == 1:
            return
        self._blocking("barrier", 0, None, self.mpi.Barrier, ())
