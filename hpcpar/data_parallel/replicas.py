"""Data parallelism: replicas average their gradients, in buckets, overlapped with the backward pass.

Each replica (a DP rank) runs the same model on its own share of the global batch.  Gradients arrive
pre-scaled by 1 / (tokens in the global batch), so *summing* them over the DP group gives exactly the
gradient of the single-rank step.  The sum runs bucket by bucket: the parameters live in flat buffers
(flat.py) filled in backward order, and as soon as the last micro-batch's backward has finished every
parameter of a bucket, a non-blocking ``Iallreduce`` on that bucket starts - while the backward of the
earlier layers continues.  ``finish()`` waits for all of them before the optimizer step.  Under
context parallelism the group is every rank with the same parameters, dp x cp of them
(``grid.dp_cp_comm``): a CP rank's gradients are the partial sums over its tokens, summed like a replica's.

ZeRO-1 (Rajbhandari et al. 2020): instead of an all-reduce, each bucket is *reduce-scattered*, so DP
rank i receives the summed gradient of its 1/dp range only; it keeps optimizer state for that range
only and updates it; an all-gather of the parameters then gives every replica the whole new model.
Same bytes on the wire as one all-reduce (which *is* a reduce-scatter followed by an all-gather),
1/dp of the optimizer memory.  ZeRO-2 also frees each bucket's full gradient buffer once its
reduce-scatter is done and allocates it again, zeroed, at the next step's start: between steps a
rank holds only its range of the gradients.  The buffer itself must live through the backward (every
micro-batch of a pipeline adds into it), so each bucket is reduce-scattered once, after the last
micro-batch.  ZeRO-3 shards the parameters too: hpcpar/data_parallel/fsdp.py.  HSDP (``--dp-shard``)
cuts over a shard group inside the replicas and all-reduces each owned range across the groups (flat.py).

Under expert parallelism an expert's parameters are held by fewer ranks, its expert-data-parallel
group ((dp x cp) / ep of them, comm/grid.py's fold): they get buckets of their own, and everything done
per bucket above (the sum, the ZeRO cut, the gather, the norm's count) runs over the bucket's groups.

Some gradients are not final when the backward ends: the two copies of a tied embedding (first and
last pipeline stage) must first be summed, and under sequence parallelism the replicated LayerNorm
and bias gradients are partial sums over the TP group.  Those go into a *late* bucket (one per group),
summed and reduced in ``finish``.
"""
import time

from hpcpar import inflight
from hpcpar import tracer as trace
from hpcpar.data_parallel.flat import FlatBuffer
from hpcpar.data_parallel.protocol import Replicas, self_group
from hpcpar.comm import test_all, wait_all


def cut_buckets(groups, bucket_bytes):
    """Cut the parameter ``groups`` (lists of parameters final at the same moment, in the order they
    become final) into buckets in that order, each about ``bucket_bytes``.  A bucket holds whole groups
    while they fit: one that does not fit starts a new bucket, because a bucket spanning two groups
    could not start before the later one is final.  A group larger than ``bucket_bytes`` is cut into
    buckets of its own (never splitting a parameter); they start together.  -> lists of parameters."""
    buckets, current, size = [], [], 0

    def close():
        nonlocal current, size
        if current:
            buckets.append(current)
        current, size = [], 0
    for group in groups:
        group_bytes = sum(p.data.nbytes for p in group)
        if size + group_bytes > bucket_bytes:
            close()
        for p in group:
            current.append(p)
            size += p.data.nbytes
            if size >= bucket_bytes:
                close()
        if group_bytes > bucket_bytes:        # the rest of a cut group: no later group joins it
            close()
    close()
    return buckets


class DataParallel(Replicas):
    def __init__(self, params, comm, bucket_mb=4.0, zero=0, late=(), uses=None, compute_dtype=None,
                 groups=None, groups_of=None, whole_tensors=False):
        """``comm``: the replicas (dp x cp).  ``groups_of(p)``: (shard, across) - the group ZeRO cuts a
        parameter's buffer over and the one its owned range is all-reduced over afterwards (HSDP, or
        an expert's groups: Trainer.groups_of); default (``comm``, None).  ZeRO-0 cuts over one rank and
        all-reduces across the shard group.  Parameters of other groups (an expert's) get buckets of
        their own.  ``zero``: the ZeRO stage, 0, 1 or 2.  ``late``: parameters summed over another group
        first (``finish``).  ``uses``: Replicas'.  ``compute_dtype``: the low precision of the weights'
        compute copy under mixed precision (flat.py).  ``groups``: ``params`` as the backward reports
        them ready, in that order (Stage.grad_groups); buckets are cut along them and filled with each
        group's parameters in reverse order (the backward's).  Default: one parameter at a time, in the
        reverse of ``params``.  ``whole_tensors``: each parameter owned whole by one rank (flat.py)."""
        self.comm, self.zero = comm, zero
        groups = [[p] for p in reversed(params)] if groups is None else groups
        if sorted(id(p) for g in groups for p in g) != sorted(id(p) for p in params):
            raise ValueError("the groups must hold every parameter exactly once")
        groups_of = groups_of or (lambda p: (comm, None))
        if zero == 0:                   # each rank owns its buffers whole: the sum is one all-reduce
            one, cut = self_group(), groups_of
            if any(cut(p)[1] is not None for p in params):
                raise ValueError("HSDP's groups across need ZeRO 1-3: ZeRO-0 sums over every replica at once")
            groups_of = lambda p: (one, cut(p)[0])                          # noqa: E731
        self._late_ids = {id(p) for p in late}
        kinds = list({tuple(map(id, groups_of(p))): groups_of(p) for p in params}.values())
        flats, self.lates, loads = [], [], {}
        for shard, across in kinds:
            mine = lambda p: tuple(map(id, groups_of(p))) == (id(shard), id(across))     # noqa: E731
            load = loads.setdefault(id(shard), [0] * shard.size)       # whole tensors: the group's balance
            make = lambda ps, load=load: FlatBuffer(ps, shard, compute_dtype, across,        # noqa: E731
                                                    whole_tensors=whole_tensors, load=load)
            backward_order = [[p for p in reversed(g) if id(p) not in self._late_ids and mine(p)] for g in groups]
            flats += [make(ps) for ps in cut_buckets(backward_order, int(bucket_mb * 2**20))]
            if any(mine(p) for p in late):               # laid out alone: as on the stage it is tied to
                flats.append(make([p for p in late if mine(p)], None))
                self.lates.append(flats[-1])
        super().__init__(flats, uses)
        # HSDP: a sum's all-reduce across follows its reduce-scatter, posted by a poll that sees it done
        self._two_phases = any(f.group.size > 1 and f.across is not None for f in flats)
        self.launch_times = []          # perf_counter() of each bucket launch (overlap is measurable)
        # MPICH moves a non-blocking all-reduce on only inside MPI calls, and it needs several of them
        # (one per round of its algorithm): the buckets in flight are tested (MPI_Testall) so that
        # they progress during the backward too - "gemms": between the backward's GEMMs (inflight.py)
        # and whenever it reports gradients; "reports": only when it reports; "off": never
        self.poll = "gemms"
        self.start_step()

    def start_step(self):
        for f in self.flats:
            if f.grad is None:                          # ZeRO-2 freed it after the last step's reduce-scatter
                f.new_grad()
        super().start_step()
        self.launch_times = []

    def grads_ready(self, params):
        super().grads_ready([p for p in params if id(p) not in self._late_ids])
        if self.poll != "off":
            self._poll()

    def _poll(self):
        test_all(self.sums.requests())
        if self._two_phases:
            self.sums.poll()

    def _launch(self, i):
        if super()._launch(i):
            self.launch_times.append(time.perf_counter())
            if self.poll == "gemms":
                inflight.install(self._poll)

    def _late_grads(self, params):
        """The late buckets' gradients of ``params``: one view per run of them lying side by side."""
        runs = []
        for late in self.lates:
            for p, a, b in late.segments:
                if any(p is q for q in params):
                    if runs and runs[-1][0] is late and runs[-1][2] == a:
                        runs[-1][2] = b
                    else:
                        runs.append([late, a, b])
        return [late.grad[a:b] for late, a, b in runs]

    def finish(self, late=()):
        """``late``: (communicator, parameters) pairs whose gradients are summed over that communicator
        first (the tied embedding's two copies, sequence parallelism's partial sums; they sit together
        in the late bucket).  Then launch what is left (in bucket order, the same on every DP rank) and
        wait for everything; ZeRO-2 frees the full gradient buffers."""
        for comm, params in late:
            for grads in self._late_grads(params):
                comm.all_reduce_(grads)
        for i in range(len(self.flats)):
            self._launch(i)
        start = time.perf_counter()
        inflight.install(None)
        wait_all(self.sums.requests())
        self.sums.poll(keep=0)                          # HSDP: the all-reduces across, in order
        tracer = trace.active()
        if tracer is not None and self.comm.size > 1:
            tracer.span("dp wait", "collective", start, time.perf_counter(), "comm")
            for i, t in enumerate(self.launch_times):        # in flight from launch to the end of the wait
                tracer.span(f"bucket {i}", "dp-overlap", t, time.perf_counter(), "dp")
        if self.zero >= 2:
            for f in self.flats:
                f.drop_grad()

    def gather_params(self):
        """ZeRO-1/2: every rank of a shard group receives the others' updated ranges.  Then (mixed
        precision) the compute copies are rounded from the updated masters."""
        wait_all([f.share_update() for f in self.flats])
        for f in self.flats:
            f.refresh()
