"""ZeRO-3 / fully sharded data parallelism: each rank keeps only its slice of the parameters.

ZeRO-1 shards the optimizer state over the n = dp x cp ranks that hold the same parameters, ZeRO-2
the gradients too (data_parallel/replicas.py); ZeRO-3 (Rajbhandari et al. 2020; PyTorch's FSDP) shards the
parameters themselves.  The model is cut into *units* - the embedding, each block (or ``--fsdp-blocks``
consecutive blocks), the head - and each unit's parameters (this rank's TP shard of them) live in one
flat buffer of ``size`` numbers, padded to a multiple of n, of which a rank keeps only its slice
[rank k, (rank + 1) k), k = size / n: the master values and their gradient.  Around a module:

    before its forward     all-gather the unit (in the compute dtype): every rank's slice, in place
    after its forward      free the gathered buffer (--reshard-after-forward; or keep it until the
                           unit's last backward of the step: fewer gathers, more memory); the
                           stage's last module keeps it anyway: its backward needs it first
    before its backward    all-gather again (if freed), allocate the unit's full gradient buffer
    after its backward     free the gathered buffer; once the unit's last backward of the step has
                           finished its gradients, reduce-scatter them into this rank's slice and
                           free the full gradient buffer

Gathers are *prefetched*: before a module's forward the next module's gather is posted (before its
backward, the previous module's), non-blocking, and waited for only when that module starts - so
it travels while this module computes.

Under ``--trace`` each unit's life is on the rank's ``fsdp`` track (``hpcpar trace plot --zero``):
``all-gather u`` from its post to the end of its wait, ``F u`` / ``B u`` the module's compute, ``free u``
(an instant), ``reduce-scatter u`` from its post until this rank sees it complete; u is the unit's
number, in the order of the stage's modules.

Per rank, with P the stage's parameters (its TP shard), n = dp x cp, b bytes a number:

    ZeRO-0   P b params + P b grads + 2 P b AdamW state
    ZeRO-1   P b        + P b       + 2 P b / n
    ZeRO-2   P b        + P b / n   + 2 P b / n   (between steps; the full gradient lives in the backward)
    ZeRO-3   P b / n    + P b / n   + 2 P b / n   + the gathered units (at most two, or all of them
                                                    with reshard-after-forward off) and their gradients

Under expert parallelism a block's routed experts (E/ep of them, whole over TP) are held by fewer
ranks: their replicas are the expert-data-parallel group, (dp x cp) / ep ranks (``comm_of``).  They
form a unit of their own, sliced, all-gathered and reduce-scattered over that group, and gathered,
prefetched and freed together with the block's other unit; over a group of one rank (ep = dp x cp)
that unit is *resident*: the slice is the whole, as under ZeRO-0, and nothing is sent.

A parameter moved by a rule rather than by its gradient - DeepSeek-V3's routing bias (nn/moe.py): every
rank moves the whole of it after the step, from the same global counts, and its gradient is zero by
construction - is kept *whole* on every rank: a module's such parameters form a resident unit over a
group of one rank, so the rule moves this rank's own master values, and the unit is counted in the
gradient norm on rank 0 of dp x cp only (its dp x cp copies are one parameter).

Some gradients are final only after a sum over another group: the two copies of a tied embedding
(first and last pipeline stage, each a unit of its own, so that their slices line up) and, under
sequence parallelism, the replicated parameters' partial sums over TP (every TP rank has the same
units, so the slices line up too).  Those are summed *after* the reduce-scatter, on the slices:
the sums commute.
"""
import time

from mpi4py import MPI

from hpcpar import backend, progress
from hpcpar.trace import tracer as trace
from hpcpar.data_parallel.buckets import FlatSlice, placeholder, whole_in
from hpcpar.comm import Communicator, test_all, wait_all


class Unit:
    """Parameters gathered and freed together over ``comm``; this rank keeps slice [lo, hi) of their flat
    buffer.  Over a group of one rank (an expert's when ep = dp x cp) the slice is the whole: the unit is
    *resident* - its parameters view the slice (or, under mixed precision, a compute copy of it kept
    between steps, and ``master`` the slice) and accumulate their gradients in it, as under ZeRO-0;
    nothing is gathered, freed or reduce-scattered."""

    def __init__(self, params, comm, compute_dtype):
        xp = backend.array_module(params[0].data)
        dtype = params[0].data.dtype
        self.comm = comm
        self.compute_dtype = compute_dtype if compute_dtype is not None else dtype
        n = comm.size
        total = sum(p.data.size for p in params)
        self.size = -(-total // n) * n                          # padded to a multiple of n
        k = self.size // n
        self.lo, self.hi = comm.rank * k, (comm.rank + 1) * k
        flat = xp.zeros(self.size, dtype=dtype)                 # (size,) only while building
        self.segments, start = [], 0                            # (param, start, stop)
        for p in params:
            stop = start + p.data.size
            flat[start:stop] = p.data.reshape(-1)
            self.segments.append((p, start, stop))
            start = stop
        self.params = list(params)
        self.shard = flat[self.lo:self.hi].copy()               # (k,) master values of this rank's slice
        self.shard_grad = xp.zeros(k, dtype=dtype)              # (k,) their reduce-scattered gradient
        self.full = None                                        # (size,) compute dtype, while gathered
        self.grad = None                                        # (size,) while the backward runs
        self.gathering = None                                   # the all-gather's request, until waited
        self.resident = n == 1
        for p in params:
            p.master = None
            p.data, p.grad = placeholder(p.data), placeholder(p.grad)
        if self.resident:                                       # gathered and with a gradient for good
            self.full = self.shard if self.compute_dtype == dtype else self.shard.astype(self.compute_dtype)
            self.grad = self.shard_grad
            self._view()
            for p, a, b in self.segments:
                p.grad = self.grad[a:b].reshape(p.grad.shape)
                if self.full is not self.shard:                 # what a rule moves (nn/moe.py update_bias)
                    p.master = self.shard[a:b].reshape(p.grad.shape)

    @property
    def gathered(self):
        return self.full is not None

    def start_gather(self):
        xp = backend.array_module(self.shard)
        self.full = xp.empty(self.size, dtype=self.compute_dtype)
        self.full[self.lo:self.hi] = self.shard                 # (rounded to the compute dtype)
        self.gathering = self.comm.iall_gather_(self.full)

    def finish_gather(self):
        if self.gathering is not None:
            self.gathering.wait()
            self.gathering = None
        self._view()

    def _view(self):
        for p, a, b in self.segments:
            p.data = self.full[a:b].reshape(p.data.shape)

    def free(self):
        """Drop the gathered values (a gather in flight is finished first: MPI still writes into it)."""
        if self.resident:
            return
        if self.gathering is not None:
            self.gathering.wait()
            self.gathering = None
        self.full = None
        for p, _, _ in self.segments:
            p.data = placeholder(p.data)

    def refresh(self):
        """A resident unit's compute copy rounded again from its master values (after they changed)."""
        if self.resident and self.full is not self.shard:
            self.full[...] = self.shard

    def new_grad(self):
        xp = backend.array_module(self.shard)
        self.grad = xp.zeros(self.size, dtype=self.shard.dtype)
        for p, a, b in self.segments:
            p.grad = self.grad[a:b].reshape(p.grad.shape)

    def drop_grad(self):
        if self.resident:
            return
        self.grad = None
        for p, _, _ in self.segments:
            p.grad = placeholder(p.grad)

    def owned(self, predicate):
        """(a, b) ranges of this rank's slice, relative to it, covered by parameters with ``predicate``."""
        out = []
        for p, a, b in self.segments:
            a, b = max(a, self.lo), min(b, self.hi)
            if a < b and predicate(p):
                out.append((a - self.lo, b - self.lo))
        return out

    def gathered_bytes(self):
        """Bytes of the working set: gathered values and full gradient (a resident unit's are its state)."""
        if self.resident:
            return 0
        return (self.full.nbytes if self.full is not None else 0) + (self.grad.nbytes if self.grad is not None else 0)

    def weight_bytes(self):
        """Bytes of weights kept between steps: the slice, and a resident unit's compute copy."""
        return self.shard.nbytes + (self.full.nbytes if self.resident and self.full is not self.shard else 0)


def module_groups(chunk, blocks_per_unit):
    """The chunk's modules cut into units' worth: the embedding, runs of ``blocks_per_unit`` blocks, the head."""
    blocks = list(chunk.blocks)
    groups = [[chunk.embed]] if chunk.embed else []
    groups += [blocks[i:i + blocks_per_unit] for i in range(0, len(blocks), blocks_per_unit)]
    return groups + ([[chunk.head]] if chunk.head else [])


class FullyShardedDataParallel:
    """ZeRO-3 over ``comm`` (dp x cp) for the model ``chunks`` of this rank; DataParallel's interface
    for the trainer, and the hooks a Stage calls around each module's forward and backward."""

    zero, sharded = 3, True

    def __init__(self, chunks, comm, uses=None, compute_dtype=None, alone=(), blocks_per_unit=1,
                 reshard_after_forward=True, comm_of=None, whole=()):
        """``alone``: parameters that get a unit of their own (the tied embedding: its two copies'
        slices must line up); so does a parameter two modules share.  ``uses``: as DataParallel's.
        ``comm_of(p)``: the group a parameter's replicas sit on, when not ``comm`` (an expert's, under
        expert parallelism): a module's parameters of another group form a unit of their own, sliced,
        gathered and reduce-scattered over it - and gathered and freed with the module's other units.
        ``whole``: parameters every rank keeps whole (moved by a rule, module docstring): a module's
        form a resident unit over a group of one rank."""
        self.comm, self.reshard = comm, reshard_after_forward
        kept = {id(p) for p in whole}
        one = Communicator(MPI.COMM_SELF, "self") if kept else None
        replicas = comm_of or (lambda p: comm)
        comm_of = lambda p: one if id(p) in kept else replicas(p)              # noqa: E731
        self._uses = uses or {}
        holders = {}
        for chunk in chunks:
            for m in chunk.modules():
                for p in m.parameters():
                    holders[id(p)] = holders.get(id(p), 0) + 1
        alone = {id(p) for p in alone} | {k for k, v in holders.items() if v > 1}
        self.units, self._unit_of = [], {}

        def add(params):
            groups = {}                                 # the parameters of each group, in their order
            for p in params:
                groups.setdefault(id(comm_of(p)), (comm_of(p), []))[1].append(p)
            for group, mine in groups.values():
                self.units.append(Unit(mine, group, compute_dtype))
                self._unit_of.update((id(p), self.units[-1]) for p in mine)
        for chunk in chunks:
            for group in module_groups(chunk, blocks_per_unit):
                params = [p for m in group for p in m.parameters() if id(p) not in self._unit_of]
                for p in params:
                    if id(p) in alone:
                        add([p])
                add([p for p in params if id(p) not in alone])
        self.dtype = self.units[0].shard.dtype          # of the master weights, gradients, optimizer state
        # a whole unit's dp x cp copies are one parameter: counted in the norm on rank 0 of comm only
        self._counted = [comm.rank == 0 or not any(id(p) in kept for p in u.params) for u in self.units]
        self._module_units = {}
        for chunk in chunks:
            chunk.sharding = self
            for m in chunk.modules():
                self._module_units[id(m)] = list({id(self._unit_of[id(p)]): self._unit_of[id(p)]
                                                  for p in m.parameters()}.values())
        self.peak_gathered = 0              # the most bytes of gathered units and full gradients at once
        self.gathers = 0                    # all-gathers started this step
        self.waits = []                     # seconds blocked in each wait for gathers this step
        self.prefetch = True                # off: each gather starts when its module needs it (benchmarks
        #                                     measure what prefetching hides)
        self._in_flight = []                # (unit, its reduce-scatter's request)
        self._number = {id(u): i for i, u in enumerate(self.units)}
        self._posted = {}                   # ("gather" | "reduce", id(unit)) -> when that was posted
        self._began = 0.0                   # when the current module's compute began

    def _mark(self, what, units, start, end=None):
        """A span on the trace's fsdp track, named by the units' numbers (nothing without a tracer)."""
        tracer = trace.active()
        if tracer is not None and units:
            names = ",".join(str(self._number[id(u)]) for u in units)
            tracer.span(f"{what} {names}", "fsdp", start, time.perf_counter() if end is None else end, "fsdp")

    # --- the hooks around a module (nn/stage.py) -------------------------------------------------

    def _units(self, modules, i):
        return self._module_units[id(modules[i])] if 0 <= i < len(modules) else []

    def _post(self, units):
        for u in units:
            if not u.gathered:
                self._posted["gather", id(u)] = time.perf_counter()
                u.start_gather()
                self.gathers += 1
        self._account()

    def _acquire(self, units):
        self._post(units)
        start = time.perf_counter()
        for u in units:
            u.finish_gather()
        end = time.perf_counter()
        self.waits.append(end - start)
        tracer = trace.active()
        if tracer is not None and end - start > 1e-5:
            tracer.span("fsdp gather wait", "collective", start, end, "comm")
        for u in units:
            if ("gather", id(u)) in self._posted:
                self._mark("all-gather", [u], self._posted.pop(("gather", id(u))), end)

    def _release(self, units, keep_for):
        for u in units:
            if u not in keep_for:
                u.free()
                now = time.perf_counter()
                self._mark("free", [u], now, now)

    def before_forward(self, modules, i):
        self._acquire(self._units(modules, i))
        if self.prefetch:
            self._post(self._units(modules, i + 1))       # travels while module i computes
        self._began = time.perf_counter()

    def after_forward(self, modules, i, training):
        """The last module's units stay gathered in training: its backward is the first to need them."""
        self._mark("F", self._units(modules, i), self._began)
        last = i == len(modules) - 1
        if not training or (self.reshard and not last):
            self._release(self._units(modules, i), self._units(modules, i + 1))

    def before_backward(self, modules, i):
        units = self._units(modules, i)
        self._acquire(units)
        for u in units:
            if u.grad is None:
                self._reap(keep=1)
                u.new_grad()
        if self.prefetch:
            self._post(self._units(modules, i - 1))
        self._account()
        self._began = time.perf_counter()

    def after_backward(self, modules, i, final):
        """``final``: the module's last backward of the step (its units are not needed again)."""
        self._mark("B", self._units(modules, i), self._began)
        if self.reshard or final:
            self._release(self._units(modules, i), self._units(modules, i - 1))

    def _account(self):
        now = sum(u.gathered_bytes() for u in self.units)
        self.peak_gathered = max(self.peak_gathered, now)

    # --- DataParallel's interface (train.py) -------------------------------------------------------

    def start_step(self):
        self._waiting = {id(u): len(u.params) for u in self.units}
        self._pending_uses = dict(self._uses)
        self._launched = set()
        self._in_flight = []                # (unit, its reduce-scatter's request)
        self.gathers, self.waits = 0, []
        progress.install(self._poll)

    def grads_ready(self, params):
        for p in params:
            left = self._pending_uses.get(id(p), 1) - 1
            self._pending_uses[id(p)] = left
            if left > 0:
                continue
            u = self._unit_of[id(p)]
            self._waiting[id(u)] -= 1
            if self._waiting[id(u)] == 0:
                self._launch(u)
        self._reap()

    def _reap(self, keep=None):
        """Free the full gradient of every unit whose reduce-scatter has completed (one MPI_Test each);
        with ``keep``, first wait for the oldest until at most ``keep`` are in flight - a bound on the
        full gradients alive at once, however slowly the reduce-scatters move."""
        while keep is not None and len(self._in_flight) > keep:
            u, r = self._in_flight.pop(0)
            if r is not None:
                r.wait()
            self._reduced(u)
        still = []
        for u, r in self._in_flight:
            if r is None or r.test():
                self._reduced(u)
            else:
                still.append((u, r))
        self._in_flight = still
        self._account()

    def _launch(self, u):
        if id(u) in self._launched:
            return
        self._launched.add(id(u))
        if u.resident:                      # its gradient is already in its slice: nothing to reduce
            return
        self._posted["reduce", id(u)] = time.perf_counter()
        self._in_flight.append((u, u.comm.ireduce_scatter(u.grad, u.shard_grad)))

    def _reduced(self, u):
        """Unit u's reduce-scatter has completed: free its full gradient."""
        self._mark("reduce-scatter", [u], self._posted.pop(("reduce", id(u)), time.perf_counter()))
        u.drop_grad()

    def _poll(self):
        """MPICH moves non-blocking collectives on only inside MPI calls (progress.py): between the
        GEMMs, test the gathers and reduce-scatters in flight."""
        test_all([u.gathering for u in self.units if u.gathering is not None] + [r for _, r in self._in_flight])

    def finish(self, late=()):
        """Launch what is left (in unit order, the same on every rank), wait, free the full gradients;
        then sum the ``late`` (communicator, parameters) pairs' slices over their communicators."""
        for u in self.units:
            self._launch(u)
        start = time.perf_counter()
        progress.install(None)
        wait_all([r for _, r in self._in_flight])
        for u, _ in self._in_flight:
            self._reduced(u)
        self._in_flight = []
        for u in self.units:
            if u.grad is not None:
                u.drop_grad()
            if u.gathered:                  # kept for a backward that did not come (forward only)
                u.free()
        tracer = trace.active()
        if tracer is not None:
            tracer.span("dp wait", "collective", start, time.perf_counter(), "comm")
        for comm, params in late:
            self._sum_slices(comm, {id(p) for p in params})

    def _sum_slices(self, comm, ids):
        """All-reduce over ``comm`` the parts of this rank's gradient slices that hold ``ids``."""
        pieces = [(u, a, b) for u in self.units for a, b in u.owned(lambda p: id(p) in ids)]
        if not pieces:                      # the same on every peer: they have the same units
            return
        xp = backend.array_module(self.units[0].shard_grad)
        buf = xp.concatenate([u.shard_grad[a:b] for u, a, b in pieces])
        comm.all_reduce_(buf)
        at = 0
        for u, a, b in pieces:
            u.shard_grad[a:b] = buf[at:at + b - a]
            at += b - a

    def slices(self):
        return [FlatSlice(i, u.shard, u.shard_grad, u.owned(lambda p: p.decay), whole_in(u.segments, u.lo, u.hi))
                for i, u in enumerate(self.units)]

    def norm_sq(self, slices):
        total = 0.0
        for s, u, counted in zip(slices, self.units, self._counted):
            for a, b in u.owned(lambda p: p.counted and counted):
                g = s.grad[a:b]
                total = total + g @ g
        return total

    def gather_params(self):
        """Nothing to gather: a unit is gathered (and rounded to the compute dtype) when it is next used;
        a resident unit's compute copy is rounded from the updated master values now."""
        for u in self.units:
            u.refresh()

    def zero_grad(self):
        for u in self.units:
            u.shard_grad[...] = 0

    # --- whole tensors, for checkpoints and tests (collective over the group) ----------------------

    @property
    def flats(self):
        return self.units

    def owned_range(self, i):
        return self.units[i].lo, self.units[i].hi

    def whole(self, i, owned):
        """The flat array of unit i whose slice on each rank is that rank's ``owned`` (all-gathered)."""
        u = self.units[i]
        full = backend.array_module(owned).zeros(u.size, dtype=owned.dtype)
        full[u.lo:u.hi] = owned
        wait_all([u.comm.iall_gather_(full)])
        return full

    def master(self, i):
        """Unit i's whole flat master values (all-gathered)."""
        return self.whole(i, self.units[i].shard)

    def load(self, i, whole):
        """Set unit i's master values from its whole flat array (this rank keeps its slice)."""
        u = self.units[i]
        u.shard[...] = whole[u.lo:u.hi]
        u.refresh()

    def gathered(self, what="data"):
        """Collective: {parameter name: this rank's (TP-shard) values} of the master weights ("data")
        or the reduce-scattered gradients ("grad")."""
        out = {}
        for i, u in enumerate(self.units):
            full = self.master(i) if what == "data" else self.whole(i, u.shard_grad)
            out.update((p.name, full[a:b].reshape(p.data.shape)) for p, a, b in u.segments)
        return out
