"""Data parallelism: replicas average their gradients, in buckets, overlapped with the backward pass.

Each replica (a DP rank) runs the same model on its own share of the global batch.  Gradients arrive
pre-scaled by 1 / (tokens in the global batch), so *summing* them over the DP group gives exactly the
gradient of the single-rank step.  The sum runs bucket by bucket: the parameters live in flat buckets
filled in backward order (buckets.py), and as soon as the last micro-batch's backward has finished
every parameter of a bucket, a non-blocking ``Iallreduce`` on that bucket starts - while the backward
of the earlier layers continues.  ``finish()`` waits for all of them before the optimizer step.  Under
context parallelism the group is every rank with the same parameters, dp x cp of them
(``grid.dp_cp_comm``): a CP rank's gradients are the partial sums over its tokens, summed like a replica's.

ZeRO-1 (Rajbhandari et al. 2020): instead of an all-reduce, each bucket is *reduce-scattered*, so DP
rank i receives the summed gradient of its 1/dp slice only; it keeps optimizer state for that slice
only and updates it; an all-gather of the parameters then gives every replica the whole new model.
Same bytes on the wire as one all-reduce (which *is* a reduce-scatter followed by an all-gather),
1/dp of the optimizer memory.  ZeRO-2 also frees each bucket's full gradient buffer once its
reduce-scatter is done and allocates it again, zeroed, at the next step's start: between steps a
rank holds only its slice of the gradients.  The buffer itself must live through the backward (every
micro-batch of a pipeline adds into it), so each bucket is reduce-scattered once, after the last
micro-batch.  ZeRO-3 shards the parameters too: hpcpar/data_parallel/fsdp.py.

Under expert parallelism an expert's parameters are held by fewer ranks, its expert-data-parallel
group ((dp x cp) / ep of them, hpcpar/expert_parallel/dispatch.py): they get buckets of their own, and
everything done per bucket above (the sum, the ZeRO cut, the gather, the norm's count) runs over the
bucket's group (``comms``).

Some gradients are not final when the backward ends: the two copies of a tied embedding (first and
last pipeline stage) must first be summed, and under sequence parallelism the replicated LayerNorm
and bias gradients are partial sums over the TP group.  Those go into a *late* bucket (one per group),
summed and reduced in ``finish``.
"""
import time

from hpcpar import backend, progress
from hpcpar.trace import tracer as trace
from hpcpar.data_parallel.buckets import Bucket, FlatSlice, make_buckets, whole_in
from hpcpar.comm import test_all, wait_all


class DataParallel:
    def __init__(self, params, dp_comm, bucket_mb=4.0, zero=0, late=(), uses=None, compute_dtype=None,
                 groups=None, comm_of=None):
        """``uses``: {id(param): how many model chunks report it ready} - a parameter that two chunks
        of this rank share (the tied embedding when one rank holds both ends of an interleaved model)
        is final only when the last of them is done with it. Default 1 each.  ``compute_dtype``: the
        low precision of the weights' compute copy under mixed precision (buckets.py).  ``groups``:
        ``params`` as the backward reports them ready, in that order (Stage.grad_groups); buckets are
        cut along them and filled with each group's parameters in reverse order (the backward's).
        Default: one parameter at a time, in the reverse of ``params``.  ``zero``: the ZeRO stage, 0, 1 or 2.
        ``comm_of(p)``: the group a parameter's replicas sit on, when not ``dp_comm`` (an expert's, under
        expert parallelism): its parameters get buckets of their own, summed and ZeRO-cut over it."""
        self.comm, self.zero = dp_comm, zero
        self.sharded = zero >= 1                        # each rank updates (and owns the state of) its slice
        self._uses = uses or {}
        groups = [[p] for p in reversed(params)] if groups is None else groups
        if sorted(id(p) for g in groups for p in g) != sorted(id(p) for p in params):
            raise ValueError("the groups must hold every parameter exactly once")
        comm_of = comm_of or (lambda p: dp_comm)
        comms = [dp_comm] + [c for c in {id(comm_of(p)): comm_of(p) for p in params}.values() if c is not dp_comm]
        late_ids = {id(p) for p in late}
        self.buckets, self.comms, self.lates = [], [], []       # comms[i]: the group bucket i is summed over
        for comm in comms:
            mine = lambda p: comm_of(p) is comm            # noqa: E731 (used at once)
            align = comm.size if self.sharded else 1
            backward_order = [[p for p in reversed(g) if id(p) not in late_ids and mine(p)] for g in groups]
            made = make_buckets(backward_order, int(bucket_mb * 2**20), align, compute_dtype)
            if any(mine(p) for p in late):
                made.append(Bucket([p for p in late if mine(p)], align, compute_dtype))
                self.lates.append(made[-1])
            self.buckets += made
            self.comms += [comm] * len(made)
        self.dtype = self.buckets[0].data.dtype          # of the master weights, gradients, optimizer state
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b.params}
        xp = backend.array_module(self.buckets[0].data)
        self._owned_grads = [xp.empty(b.size // c.size, dtype=b.grad.dtype) for b, c in zip(self.buckets, self.comms)] \
            if self.sharded else None
        self.launch_times = []          # perf_counter() of each bucket launch (overlap is measurable)
        # MPICH moves a non-blocking all-reduce on only inside MPI calls, and it needs several of them
        # (one per round of its algorithm): the buckets in flight are tested (MPI_Testall) so that
        # they progress during the backward too - "gemms": between the backward's GEMMs (progress.py)
        # and whenever it reports gradients; "reports": only when it reports; "off": never
        self.poll = "gemms"
        self.start_step()

    def start_step(self):
        for b in self.buckets:
            if b.grad is None:                          # ZeRO-2 freed it after the last step's reduce-scatter
                b.new_grad()
        self._waiting = [len(b.params) for b in self.buckets]
        self._pending_uses = dict(self._uses)
        self._launched = [False] * len(self.buckets)
        self._requests = []
        self.launch_times = []

    def grads_ready(self, params):
        """Called by the model as the final gradients of ``params`` are complete."""
        for p in params:
            i = self._bucket_of[id(p)]
            if any(self.buckets[i] is b for b in self.lates):
                continue
            left = self._pending_uses.get(id(p), 1) - 1
            self._pending_uses[id(p)] = left
            if left > 0:
                continue
            self._waiting[i] -= 1
            if self._waiting[i] == 0:
                self._launch(i)
        if self.poll != "off":
            self._progress()

    def _progress(self):
        test_all(self._requests)

    def _late_grads(self, params):
        """The late buckets' gradients of ``params``, one contiguous view per late bucket that holds some
        (they were placed together)."""
        out = []
        for late in self.lates:
            spans = [(a, b) for p, a, b in late.segments if any(p is q for q in params)]
            if not spans:
                continue
            lo, hi = spans[0][0], spans[-1][1]
            if sum(b - a for a, b in spans) != hi - lo:
                raise ValueError("late parameters are not contiguous in their bucket")
            out.append(late.grad[lo:hi])
        return out

    def _launch(self, i):
        if self._launched[i]:
            return
        self._launched[i] = True
        self.launch_times.append(time.perf_counter())
        b, comm = self.buckets[i], self.comms[i]
        if self.sharded:
            self._requests.append(comm.ireduce_scatter(b.grad, self._owned_grads[i]))
        else:
            self._requests.append(comm.iall_reduce_(b.grad))
        if self.poll == "gemms":
            progress.install(self._progress)

    def finish(self, late=()):
        """``late``: (communicator, parameters) pairs whose gradients are summed over that communicator
        first (the tied embedding's two copies, sequence parallelism's partial sums; they sit together
        in the late bucket).  Then launch what is left (in bucket order, the same on every DP rank) and
        wait for everything; ZeRO-2 frees the full gradient buffers."""
        for comm, params in late:
            for grads in self._late_grads(params):
                comm.all_reduce_(grads)
        for i in range(len(self.buckets)):
            self._launch(i)
        start = time.perf_counter()
        progress.install(None)
        wait_all(self._requests)
        self._requests = []
        tracer = trace.active()
        if tracer is not None and self.comm.size > 1:
            tracer.span("dp wait", "collective", start, time.perf_counter(), "comm")
            for i, t in enumerate(self.launch_times):        # in flight from launch to the end of the wait
                tracer.span(f"bucket {i}", "dp-overlap", t, time.perf_counter(), "dp")
        if self.zero >= 2:
            for b in self.buckets:
                b.drop_grad()

    def slices(self):
        """The flat slices this rank updates: whole buckets, or its ZeRO range of each (ZeRO-1)."""
        out = []
        for i, b in enumerate(self.buckets):
            lo, hi = self.owned_range(i)
            grad = self._owned_grads[i] if self.sharded else b.grad
            decay = [(a - lo, c - lo) for a, c in b.ranges(lo, hi, lambda p: p.decay)]
            out.append(FlatSlice(i, b.data[lo:hi], grad, decay, whole_in(b.segments, lo, hi)))
        return out

    def norm_sq(self, slices):
        """Sum of squared gradients this rank is responsible for (each parameter counted once: on every
        rank its own ZeRO range, else on rank 0 of each bucket's group), as a 0-d array on the
        gradients' device (no copy to the host here)."""
        total = 0.0
        for i, (s, b) in enumerate(zip(slices, self.buckets)):
            if not self.sharded and self.comms[i].rank:
                continue
            lo = self.owned_range(i)[0]
            for a, c in b.ranges(lo, lo + s.grad.size, lambda p: p.counted):
                g = s.grad[a - lo:c - lo]
                total = total + g @ g
        return total

    def gather_params(self):
        """ZeRO-1: every rank receives every other rank's updated slice.  Then (mixed precision) the
        compute copies are rounded from the updated masters."""
        if self.sharded:
            wait_all([c.iall_gather_(b.data) for b, c in zip(self.buckets, self.comms)])
        for b in self.buckets:
            b.refresh()

    def zero_grad(self):
        for b in self.buckets:
            if b.grad is not None:
                b.grad[...] = 0

    # --- whole tensors, for checkpoints and tests (collective over the group when sharded) -----------

    @property
    def flats(self):
        return self.buckets

    def owned_range(self, i):
        """[lo, hi) of bucket i whose optimizer state this rank keeps."""
        b, comm = self.buckets[i], self.comms[i]
        return b.zero_range(comm.rank, comm.size) if self.sharded else (0, b.size)

    def whole(self, i, owned):
        """The flat array of bucket i whose ZeRO range on each rank is that rank's ``owned`` (all-gathered)."""
        b = self.buckets[i]
        if not self.sharded:
            return owned
        full = backend.array_module(owned).zeros(b.size, dtype=owned.dtype)
        lo, hi = self.owned_range(i)
        full[lo:hi] = owned
        wait_all([self.comms[i].iall_gather_(full)])
        return full

    def master(self, i):
        """Bucket i's whole flat master values (every rank holds them)."""
        return self.buckets[i].data

    def load(self, i, whole):
        """Set bucket i's master values (and their compute copy) from its whole flat array."""
        self.buckets[i].data[...] = whole
        self.buckets[i].refresh()

    def gathered(self, what="data"):
        """{parameter name: this rank's (TP-shard) values} of the master weights ("data") or the summed
        gradients ("grad", after ``finish``)."""
        out = {}
        for i, b in enumerate(self.buckets):
            full = b.data if what == "data" else self.whole(i, self._owned_grads[i] if self.sharded else b.grad)
            out.update((p.name, full[a:c].reshape(p.grad.shape)) for p, a, c in b.segments)
        return out
