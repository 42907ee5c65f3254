"""The replicas protocol: what the trainer, the optimizer, checkpoints and the memory count ask of data
parallelism, whichever way it holds the parameters.

Two implementations: ``DataParallel`` (replicas.py: ZeRO 0-2, every rank keeps the values whole in
buckets, summed as the backward finishes them) and ``FullyShardedDataParallel`` (fsdp.py: ZeRO-3, each
rank keeps a range of every unit, gathered around each module's forward and backward).  Both hold
their parameters in flat buffers (flat.py ``FlatBuffer``, ``flats``) and enter the model through one
door: they are the stages' hooks (nn/stage.py ``StageHooks``, set by ``attach``).  A step, as the
trainer (training/step.py) calls it:

    start_step()               a new step: the full gradients back (ZeRO-2), the counters reset
    ... the pipeline runs ...  the stages call the hooks; ``grads_ready(params)`` as gradients are final
    finish(late)               every sum started and waited for; ``late``: (communicator, parameters)
                               whose gradients are summed over another group (a tied embedding's two
                               copies, sequence parallelism's partial sums)
    slices()                   the FlatSlices this rank's optimizer updates: its owned range of each buffer
    norm_sq(slices)            this rank's share of the squared gradient norm, each number counted once
    gather_params()            after the update: the new values where the model reads them
    zero_grad()

and, collective over each buffer's shard group, for checkpoints and tests: ``owned_range(i)``,
``whole(i, owned)``, ``master(i)``, ``load(i, whole)``, ``gathered(what)``; ``owner(p)`` names the rank
that holds a parameter whole (whole-tensor ownership, flat.py).

The gradient sums of one step run in a queue (``Sums``): each is posted as its buffer's gradients are
final, and its second phase (HSDP's all-reduce across shard groups) in the order the sums started -
MPI matches collectives by their order, the same on every rank.
"""
from hpcpar.nn.stage import StageHooks


class Sum:
    """One buffer's gradient sum in flight: the reduce-scatter inside its shard group, then the
    all-reduce of the owned range across the groups (either may be nothing)."""

    def __init__(self, flat):
        self.flat, self.request, self.second = flat, flat.reduce_inside(), False

    def move(self, block, post=True):
        """Wait for (``block``) or test the phase in flight; then post the second, if ``post`` (every
        earlier sum has posted its own).  True once the sum is complete."""
        while True:
            if self.request is not None:
                if block:
                    self.request.wait()
                elif not self.request.test():
                    return False
                self.request = None
            if self.second:
                return True
            if not post:
                return False
            self.request, self.second = self.flat.reduce_across(), True


class Sums:
    """The step's sums in flight, in the order they started."""

    def __init__(self):
        self.queue = []

    def start(self, flat):
        s = Sum(flat)
        if s.request is None and all(q.second for q in self.queue):    # no first phase: the second now
            s.move(False)
        self.queue.append(s)

    def requests(self):
        return [s.request for s in self.queue if s.request is not None]

    def poll(self, keep=None):
        """The buffers whose sums completed, removed from the queue: with ``keep``, the oldest are
        waited for until at most ``keep`` are left, the others tested.  A second phase is posted once
        every earlier sum has posted its own: in the order the sums started, on every rank alike."""
        done, still, posted = [], [], True
        block = len(self.queue) - keep if keep is not None else 0
        for i, s in enumerate(self.queue):
            (done if s.move(i < block, posted) else still).append(s)
            posted = posted and s.second
        self.queue = still
        return [s.flat for s in done]


class Replicas(StageHooks):
    """The protocol above, and what its two implementations share: the flat buffers, counting the
    reports of final gradients, and everything about whole tensors."""

    zero = 0

    def __init__(self, flats, uses=None):
        """``uses``: {id(param): how many model chunks report it ready} - a parameter that two chunks of
        this rank share (the tied embedding when one rank holds both ends of an interleaved model) is
        final only when the last of them is done with it.  Default 1 each."""
        self.flats = flats
        self.dtype = flats[0].master.dtype           # of the master weights, gradients, optimizer state
        self._flat_of = {id(p): i for i, f in enumerate(flats) for p in f.params}
        self._uses = uses or {}
        self.sums = Sums()

    def attach(self, stages):
        """Become the hooks of ``stages``: the door through which they report (nn/stage.py)."""
        for s in stages:
            s.hooks = self

    def start_step(self):
        self._waiting = [len(f.params) for f in self.flats]
        self._pending_uses = dict(self._uses)
        self._launched = [False] * len(self.flats)
        self.sums = Sums()

    def grads_ready(self, params):
        """Called by the model as the final gradients of ``params`` are complete: a buffer whose last
        parameter this was starts its sum (``_launch``)."""
        for p in params:
            left = self._pending_uses.get(id(p), 1) - 1
            self._pending_uses[id(p)] = left
            if left > 0:
                continue
            i = self._flat_of[id(p)]
            self._waiting[i] -= 1
            if self._waiting[i] == 0:
                self._launch(i)

    def _launch(self, i):
        """Start buffer i's sum, once a step."""
        if self._launched[i]:
            return False
        self._launched[i] = True
        self.sums.start(self.flats[i])
        return True

    def slices(self):
        """The flat slices this rank updates: its owned range of each buffer."""
        return [f.slice(i) for i, f in enumerate(self.flats)]

    def norm_sq(self, slices):
        """Sum of squared gradients this rank is responsible for (each number counted once: in its
        owner's range, on one rank of the groups across), as a 0-d array on the gradients' device (no
        copy to the host here)."""
        total = 0.0
        for s, f in zip(slices, self.flats):
            if f.counted:
                for a, b in f.ranges(lambda p: p.counted):
                    g = s.grad[a:b]
                    total = total + g @ g
        return total

    def zero_grad(self):
        """Zero every gradient this rank holds: the full buffers that exist, and the owned ranges."""
        for f in self.flats:
            if f.grad is not None:
                f.grad[...] = 0
            if f.owned_grad is not f.grad:
                f.owned_grad[...] = 0

    # --- whole tensors, for checkpoints and tests (collective over each buffer's shard group) -------

    def owned_range(self, i):
        """[lo, hi) of buffer i whose optimizer state this rank keeps."""
        return self.flats[i].lo, self.flats[i].hi

    def owner(self, p):
        """The rank of its shard group that holds ``p`` whole (None where it straddles two ranges)."""
        return self.flats[self._flat_of[id(p)]].owner(p)

    def whole(self, i, owned):
        """The flat array of buffer i whose owned range on each rank is that rank's ``owned`` (gathered)."""
        return self.flats[i].whole(owned)

    def master(self, i):
        """Buffer i's whole flat master values."""
        f = self.flats[i]
        return f.master if f.resident else f.whole(f.master)

    def load(self, i, whole):
        """Set buffer i's master values (and their compute copy) from its whole flat array."""
        f = self.flats[i]
        f.master[...] = whole if f.resident else whole[f.lo:f.hi]
        f.refresh()

    def gathered(self, what="data"):
        """Collective: {parameter name: this rank's (TP-shard) values} of the master weights ("data") or
        the summed gradients ("grad", after ``finish``)."""
        out = {}
        for i, f in enumerate(self.flats):
            full = self.master(i) if what == "data" else f.whole(f.owned_grad)
            out.update((p.name, full[a:b].reshape(p.data.shape)) for p, a, b in f.segments)
        return out


def self_group():
    """A group of this rank alone: ZeRO-0's shard group, ZeRO-3's for what every rank keeps whole."""
    from mpi4py import MPI
    from hpcpar.comm import Communicator
    return Communicator(MPI.COMM_SELF, "self")


def shard_groups(grid, replicas, size):
    """HSDP: (shard, across) of a parameter held by ``replicas`` - its ZeRO state cut over groups of
    ``size`` consecutive replicas and all-reduced across them (folded by the grid, comm/grid.py), or
    (replicas, None): one group, plain ZeRO."""
    if size >= replicas.size:
        return replicas, None
    return grid.fold(replicas, size, (f"{replicas.name}_shard", f"{replicas.name}_across"))
