"""ZeRO-3 / fully sharded data parallelism: each rank keeps only its range of the parameters.

ZeRO-1 shards the optimizer state over the n = dp x cp ranks that hold the same parameters, ZeRO-2
the gradients too (replicas.py); ZeRO-3 (Rajbhandari et al. 2020; PyTorch's FSDP) shards the
parameters themselves.  The model is cut into *units* - the embedding, each block (or ``--fsdp-blocks``
consecutive blocks), the head - and each unit's parameters (this rank's TP shard of them) live in one
flat buffer (flat.py) of which a rank keeps only its owned range: the master values and their
gradient.  Around a module (the stage's hooks, nn/stage.py):

    before its forward     all-gather the unit (in the compute dtype): every rank's range, in place
    after its forward      free the gathered buffer (--reshard-after-forward; or keep it until the
                           unit's last backward of the step: fewer gathers, more memory); the
                           stage's last module keeps it anyway: its backward needs it first
    before its backward    all-gather again (if freed), allocate the unit's full gradient buffer
    after its backward     free the gathered buffer; once the unit's last backward of the step has
                           finished its gradients, reduce-scatter them into this rank's range and
                           free the full gradient buffer

Gathers are *prefetched*: before a module's forward the next module's gather is posted (before its
backward, the previous module's), non-blocking, and waited for only when that module starts - so
it travels while this module computes.  Under HSDP (``--dp-shard``) the gathers and reduce-scatters
run inside a shard group and each owned range is all-reduced across the groups (flat.py).

Under ``--trace`` each unit's life is on the rank's ``fsdp`` track (``hpcpar trace plot --zero``):
``all-gather u`` from its post to the end of its wait, ``F u`` / ``B u`` the module's compute, ``free u``
(an instant), ``reduce-scatter u`` from its post until this rank sees it complete; u is the unit's
number, in the order of the stage's modules.  What each rank holds: data_parallel/zero_memory.py.

Under expert parallelism a block's routed experts are held by fewer ranks: their own groups
(``groups_of``).  They form a unit of their own, cut over their group, and gathered, prefetched and
freed together with the block's other unit; over a group of one rank (ep = dp x cp) that unit is
*resident* (flat.py): the range is the whole, as under ZeRO-0, and nothing is gathered.

A parameter moved by a rule rather than by its gradient - DeepSeek-V3's routing bias (nn/moe.py): every
rank moves the whole of it after the step, from the same global counts, and its gradient is zero by
construction - is kept *whole* on every rank: a module's such parameters form a resident unit over a
group of one rank, so the rule moves this rank's own master values, and the unit is counted in the
gradient norm on rank 0 of dp x cp only (its dp x cp copies are one parameter).

Some gradients are final only after a sum over another group: the two copies of a tied embedding
(first and last pipeline stage, each a unit of its own, so that their ranges line up) and, under
sequence parallelism, the replicated parameters' partial sums over TP (every TP rank has the same
units, so the ranges line up too).  Those are summed *after* the reduce-scatter, on the owned
ranges: the sums commute.
"""
import time

from hpcpar import backend, inflight
from hpcpar import tracer as trace
from hpcpar.data_parallel.flat import FlatBuffer
from hpcpar.data_parallel.protocol import Replicas, self_group
from hpcpar.comm import test_all, wait_all


def module_groups(chunk, blocks_per_unit):
    """The chunk's modules cut into units' worth: the embedding, runs of ``blocks_per_unit`` blocks, the head."""
    blocks = list(chunk.blocks)
    groups = [[chunk.embed]] if chunk.embed else []
    groups += [blocks[i:i + blocks_per_unit] for i in range(0, len(blocks), blocks_per_unit)]
    return groups + ([[chunk.head]] if chunk.head else [])


class FullyShardedDataParallel(Replicas):
    """ZeRO-3 over ``comm`` (dp x cp) for the model ``chunks`` of this rank: the replicas protocol
    (protocol.py), and the hooks a Stage calls around each module's forward and backward."""

    zero = 3

    def __init__(self, chunks, comm, uses=None, compute_dtype=None, alone=(), blocks_per_unit=1,
                 reshard_after_forward=True, groups_of=None, whole=(), whole_tensors=False, fp8=(), fp8_unit=None):
        """``alone``: parameters that get a unit of their own (the tied embedding: its two copies'
        ranges must line up); so does a parameter two modules share.  ``uses``: Replicas'.
        ``groups_of(p)``: (shard, across), as DataParallel's; a module's parameters of other groups (an
        expert's) form a unit of their own - gathered and freed with the module's other units.
        ``whole``: parameters every rank keeps whole (moved by a rule, module docstring): a module's form
        a resident unit over a group of one rank.  ``whole_tensors``: flat.py's ownership.  ``fp8``: weights
        gathered as FP8 codes (--fp8-param-gather): a module's form a unit of their own, a ``fp8_unit``
        (fp8_gather.py)."""
        self.comm, self.reshard = comm, reshard_after_forward
        kept = {id(p) for p in whole}
        one = self_group() if kept else None
        cut = groups_of or (lambda p: (comm, None))
        groups_of = lambda p: (one, None) if id(p) in kept else cut(p)              # noqa: E731
        holders = {}
        for chunk in chunks:
            for m in chunk.modules():
                for p in m.parameters():
                    holders[id(p)] = holders.get(id(p), 0) + 1
        separate = {id(p) for p in alone} | {k for k, v in holders.items() if v > 1}
        flats, unit_of, coded, loads = [], {}, {id(p) for p in fp8}, {}

        def add(params, alone=False):
            """A unit of ``params`` (per group); whole tensors balanced over the group's units - but a unit of
            its own (``alone``: the tied copies on two stages) laid out alone, so that its slices line up."""
            kinds = {}                                  # the parameters of each (shard, across, in fp8), in order
            for p in params:
                kinds.setdefault(tuple(map(id, groups_of(p))) + (id(p) in coded,), (groups_of(p), []))[1].append(p)
            for key, ((shard, across), mine) in kinds.items():
                load = None if alone else loads.setdefault(id(shard), [0] * shard.size)
                flats.append((fp8_unit if key[-1] else FlatBuffer)(mine, shard, compute_dtype, across, gathered=True,
                                                                    whole_tensors=whole_tensors, load=load))
                flats[-1].counted = flats[-1].counted and (comm.rank == 0 or shard is not one)
                unit_of.update((id(p), flats[-1]) for p in mine)
        for chunk in chunks:
            for group in module_groups(chunk, blocks_per_unit):
                params = [p for m in group for p in m.parameters() if id(p) not in unit_of]
                for p in params:
                    if id(p) in separate:
                        add([p], alone=True)
                add([p for p in params if id(p) not in separate])
        super().__init__(flats, uses)
        self._module_units = {}
        for chunk in chunks:
            for m in chunk.modules():
                self._module_units[id(m)] = list({id(unit_of[id(p)]): unit_of[id(p)]
                                                  for p in m.parameters()}.values())
        self.attach(chunks)
        self.peak_gathered = 0              # the most bytes of gathered units and full gradients at once
        self.gathers = 0                    # all-gathers started this step
        self.waits = []                     # seconds blocked in each wait for gathers this step
        self.prefetch = True                # off: each gather starts when its module needs it (benchmarks
        #                                     measure what prefetching hides)
        self._number = {id(u): i for i, u in enumerate(flats)}
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
        now = sum(u.gathered_bytes() for u in self.flats)
        self.peak_gathered = max(self.peak_gathered, now)

    # --- the step (protocol.py) --------------------------------------------------------------------

    def start_step(self):
        super().start_step()
        self.gathers, self.waits = 0, []
        inflight.install(self._poll)

    def grads_ready(self, params):
        super().grads_ready(params)
        self._reap()

    def _reap(self, keep=None):
        """Free the full gradient of every unit whose sum has completed (tested in the order they
        started); with ``keep``, first wait for the oldest until at most ``keep`` are in flight - a
        bound on the full gradients alive at once, however slowly the reduce-scatters move."""
        for u in self.sums.poll(keep):
            if ("reduce", id(u)) in self._posted:
                self._mark("reduce-scatter", [u], self._posted.pop(("reduce", id(u))))
            u.drop_grad()
        self._account()

    def _launch(self, i):
        u = self.flats[i]
        if super()._launch(i) and (u.group.size > 1 or u.across is not None):     # something to send
            self._posted["reduce", id(u)] = time.perf_counter()

    def _poll(self):
        """MPICH moves non-blocking collectives on only inside MPI calls (inflight.py): between the
        GEMMs, test the gathers and reduce-scatters in flight."""
        test_all([u.gathering for u in self.flats if u.gathering is not None] + self.sums.requests())

    def finish(self, late=()):
        """Launch what is left (in unit order, the same on every rank), wait, free the full gradients;
        then sum the ``late`` (communicator, parameters) pairs' ranges over their communicators."""
        for i in range(len(self.flats)):
            self._launch(i)
        start = time.perf_counter()
        inflight.install(None)
        wait_all(self.sums.requests())
        self._reap(keep=0)
        for u in self.flats:
            if u.grad is not None:
                u.drop_grad()
            if u.gathered:                  # kept for a backward that did not come (forward only)
                u.free()
        tracer = trace.active()
        if tracer is not None:
            tracer.span("dp wait", "collective", start, time.perf_counter(), "comm")
        for comm, params in late:
            self._sum_ranges(comm, {id(p) for p in params})

    def _sum_ranges(self, comm, ids):
        """All-reduce over ``comm`` the parts of this rank's owned gradients that hold ``ids``."""
        pieces = [(u, a, b) for u in self.flats for a, b in u.ranges(lambda p: id(p) in ids)]
        if not pieces:                      # the same on every peer: they have the same units
            return
        xp = backend.array_module(self.flats[0].owned_grad)
        buf = xp.concatenate([u.owned_grad[a:b] for u, a, b in pieces])
        comm.all_reduce_(buf)
        at = 0
        for u, a, b in pieces:
            u.owned_grad[a:b] = buf[at:at + b - a]
            at += b - a

    def gather_params(self):
        """Nothing to gather: a unit is gathered (and rounded to the compute dtype) when it is next used;
        a resident unit's compute copy is rounded from the updated master values now."""
        for u in self.flats:
            u.refresh()
