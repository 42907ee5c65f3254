"""The MPI pipeline engine: run one rank's instruction list for one training step.

The schedule (schedules.py) gives this rank an ordered list of F, B, W and the sends and receives
they imply.  The engine executes it literally:

    RECV_F / RECV_B   wait for a receive that was posted ahead of time (Irecv into a pooled buffer)
    F                 forward of one micro-batch through one local chunk; the last virtual stage
                      computes the loss
    B                 backward (the whole of it, or only the input gradient when the schedule splits)
    W                 the deferred weight gradients of that micro-batch and chunk
    SEND_F / SEND_B   Isend of the output activation / input gradient; completion checked later

Every message has a tag that names it (direction, micro-batch, receiving virtual stage), and every
send is non-blocking with its receive posted ahead, so no ordering of two neighbours' instructions
can block both of them (the classic deadlock of two ranks that each Send before they Recv).

The loss of each micro-batch is the *sum* of its per-token losses, and its backward starts from
``dloss`` = 1 / (tokens in the global batch): added over micro-batches and data-parallel ranks this
is exactly the single-rank mean.  The gradients of a chunk are final after its last backward of the
step; the engine tells the chunk so (``final``), and the chunk reports them through its hooks
(nn/stage.py: data parallelism starts its sums there).
"""
import time
from collections import defaultdict

from hpcpar import backend
from hpcpar.comm import flight
from hpcpar.comm import wait_all


class BufferPool:
    """Receive buffers reused across micro-batches and steps, by shape and dtype."""

    def __init__(self, xp):
        self.xp, self.free = xp, defaultdict(list)

    def get(self, shape, dtype):
        bucket = self.free[(tuple(shape), str(dtype))]
        return bucket.pop() if bucket else self.xp.empty(shape, dtype=dtype)

    def put(self, buf):
        self.free[(buf.shape, str(buf.dtype))].append(buf)


class PipelineEngine:
    """Runs ``schedule`` for this rank: ``chunks[c]`` is the model stage of local chunk c."""

    def __init__(self, schedule, chunks, pp_comm, act_shape, dtype, lookahead=4):
        self.schedule, self.chunks, self.comm = schedule, chunks, pp_comm
        self.rank, self.p, self.v = pp_comm.rank, schedule.stages, schedule.chunks
        self.n_stages = self.p * self.v
        self.program = schedule.with_communication()[self.rank]
        self.act_shape, self.dtype, self.lookahead = act_shape, dtype, lookahead
        from mpi4py import MPI
        top = self.tag(1, schedule.microbatches - 1, self.n_stages - 1)
        # (Open MPI keeps the attribute on the world only; MPICH on every communicator)
        limit = pp_comm.mpi.Get_attr(MPI.TAG_UB) or MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        if top > limit:
            from hpcpar.runtime import UsageError
            raise UsageError(f"{schedule.microbatches} micro-batches x {self.n_stages} stages need message tags "
                             f"up to {top}, beyond this MPI's limit {limit}")
        self.local = {self.stage(c): c for c in range(self.v)}   # virtual stage -> local chunk
        self.pool = BufferPool(backend.xp())
        # the last backward action of each chunk (W when split): after it the chunk's gradients are final
        last = "W" if schedule.split_backward else "B"
        self.final_mb = {a.chunk: a.mb for a in self.program if a.op == last}
        self.timeline = []      # (start, end, op, mb, chunk) of this step, seconds from its start
        self.started = 0.0      # time.perf_counter() at the start of the step

    def stage(self, chunk):
        """The virtual stage this rank runs as its local chunk ``chunk`` (the schedule's placement)."""
        return self.schedule.stage(self.rank, chunk)

    def tag(self, direction, mb, stage):
        """Message tag: direction 0 = activation, 1 = gradient; ``stage`` = the receiving virtual stage."""
        return (mb * self.n_stages + stage) * 2 + direction

    def run(self, inputs, targets, contexts, dloss):
        """One step. inputs[mb] (first stage) / targets[mb] (last stage) / contexts[mb] per micro-batch.
        Returns this rank's per-micro-batch loss sums (empty unless it holds the last stage)."""
        caches, outputs, received, deferred, losses = {}, {}, {}, {}, {}
        posted, sends = {}, []
        t0 = self.started = time.perf_counter()
        self.timeline = []
        rec = flight.active()               # where this rank is, for a hang report (hpcpar/comm/flight.py)

        def post(i):
            """Post the receive of instruction i, if it is one and not yet posted."""
            a = self.program[i]
            if a.op in ("RECV_F", "RECV_B") and i not in posted:
                buf = self.pool.get(self.act_shape(a.mb), self.dtype)
                direction = 0 if a.op == "RECV_F" else 1
                posted[i] = (buf, self.comm.irecv_(buf, a.peer, self.tag(direction, a.mb, self.stage(a.chunk))))

        for i, a in enumerate(self.program):
            for j in range(i, min(i + self.lookahead, len(self.program))):
                post(j)
            key = (a.mb, a.chunk)
            if rec is not None:
                rec.at(a.op, a.mb)
            start = time.perf_counter()
            if a.op in ("RECV_F", "RECV_B"):
                buf, req = posted.pop(i)
                req.wait()
                received[(a.op, key)] = buf
            elif a.op == "F":
                s = self.stage(a.chunk)
                x = (inputs[a.mb] if s == 0 else received[("RECV_F", key)] if ("RECV_F", key) in received
                     else outputs.pop((a.mb, self.local[s - 1])))       # the turn of a V: same rank
                y, caches[key] = self.chunks[a.chunk].forward(x, contexts[a.mb],
                                                              targets[a.mb] if s == self.n_stages - 1 else None)
                if s == self.n_stages - 1:
                    losses[a.mb] = y
                else:
                    outputs[key] = y
            elif a.op == "B":
                s = self.stage(a.chunk)
                dy = (dloss if s == self.n_stages - 1 else received[("RECV_B", key)] if ("RECV_B", key) in received
                      else outputs.pop((a.mb, self.local[s + 1])))
                final = self.final_mb.get(a.chunk) == a.mb
                work = [] if self.schedule.split_backward else None
                dx = self.chunks[a.chunk].backward(dy, caches.pop(key), work, final)
                if s > 0:
                    outputs[key] = dx
                if work is None:
                    self._release(received, key)
                else:
                    deferred[key] = work
            elif a.op == "W":
                for fn in deferred.pop(key):
                    fn()
                self._release(received, key)
            elif a.op in ("SEND_F", "SEND_B"):
                direction = 0 if a.op == "SEND_F" else 1
                to_stage = self.stage(a.chunk) + (1 if direction == 0 else -1)
                sends.append(self.comm.isend(outputs.pop(key), a.peer, self.tag(direction, a.mb, to_stage)))
            self.timeline.append((start - t0, time.perf_counter() - t0, a.op, a.mb, a.chunk))
            sends = [r for r in sends if not r.test()]          # drive progress, drop finished sends
        wait_all(sends)
        return [losses[mb] for mb in sorted(losses)]

    def _release(self, received, key):
        for op in ("RECV_F", "RECV_B"):
            buf = received.pop((op, key), None)
            if buf is not None:
                self.pool.put(buf)
