"""The one flat buffer of data parallelism: a bucket (ZeRO 0-2) or a unit (ZeRO-3), the same class.

A buffer lays the parameters of this rank that travel together end to end in one flat array, padded
to a multiple of n, the ranks of its *shard group*, and rank r of the group owns [r k, (r + 1) k),
k = size / n (its ZeRO range: the numbers it reduces into, updates and keeps optimizer state for):

    [ p0 | p1 | p2 ... | pad ]            size numbers, every parameter's data and grad a view into it
    [ rank 0 | rank 1 | ... | rank n-1 ]  n ranges of k: who owns what

That makes three things cheap: one collective per buffer on one contiguous array; the ZeRO cut; the
optimizer's update in a handful of vectorised operations instead of one per tensor.  What it holds:

    master      the values the optimizer updates (fp32 under mixed precision): all of them, or - when the
                values are gathered when used (ZeRO-3) over n > 1 ranks - only the owned range
    compute     what the model reads, in the compute dtype: ``master`` itself, a copy rounded from it
                (mixed precision, ``refresh``), or ZeRO-3's gathered values (None while freed)
    grad        the full gradient (size,) while the backward fills it; None while freed (ZeRO-2, 3)
    owned_grad  the summed gradient of the owned range (k,); ``grad`` itself when n = 1

The sum of a gradient over the replicas has two phases: a reduce-scatter over the shard group into
``owned_grad``, then an all-reduce of that range over ``across``, the ranks that own the same range in
the other shard groups (HSDP: shard inside a node, replicate across nodes; ZeRO-0 is the case n = 1,
where the second phase is the whole all-reduce; ZeRO 1-3 without HSDP have no second phase).  A buffer
whose values are kept whole on every rank (ZeRO 0-2, or n = 1) is *resident*: nothing is gathered.

Who owns what: by default equal ranges of the flat array (a parameter may straddle two ranks).  With
``whole_tensors`` every parameter lives whole on one rank - a matrix optimizer needs the whole matrix
on its owner: the longest first, each to the rank that owns the fewest numbers so far (``owners``);
rank r's parameters fill its range from its start, k is the fullest rank's count, the rest padding.
"""
from hpcpar import backend


class FlatSlice:
    """A flat slice of parameters that one rank updates: data and grad views, decayed (a, b) ranges
    relative to the slice, the key under which the optimizer keeps its state, and ``segments``: the
    (param, a, b) lying whole in the slice (every one under whole-tensor ownership)."""

    def __init__(self, key, data, grad, decay_ranges, segments=()):
        self.key, self.data, self.grad, self.decay_ranges = key, data, grad, decay_ranges
        self.segments = list(segments)

    def tensors(self):
        """[(param, data, grad)] of the parameters whole in this slice, shaped as the parameter: what a
        matrix optimizer updates (its own state per tensor, keyed by the parameter's name)."""
        return [(p, self.data[a:b].reshape(p.data.shape), self.grad[a:b].reshape(p.data.shape))
                for p, a, b in self.segments]


def owners(sizes, n, load=None):
    """The rank of n that owns each of ``sizes`` whole: the longest first, each to the rank that owns the
    fewest numbers so far (the lowest rank on a tie) - LPT, within 4/3 of the best balance.  ``load``:
    the numbers each rank owns already in the group's other buffers, updated in place - so that the
    group is balanced, not each buffer (which would hand every buffer's longest to rank 0)."""
    owner, load = [0] * len(sizes), [0] * n if load is None else load
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        owner[i] = min(range(n), key=lambda r: load[r])
        load[owner[i]] += sizes[i]
    return owner


def layout(sizes, n, whole_tensors=False, load=None):
    """(starts, size): where each of ``sizes`` begins in a flat array of ``size`` numbers cut into n
    equal ranges - end to end and padded, or each whole in its owner's range (``load``: owners')."""
    if not whole_tensors or n == 1:
        starts, at = [], 0
        for s in sizes:
            starts.append(at)
            at += s
        return starts, -(-at // n) * n
    owner = owners(sizes, n, load)
    k = max(sum(s for s, o in zip(sizes, owner) if o == r) for r in range(n))
    starts, fill = [], [r * k for r in range(n)]
    for s, o in zip(sizes, owner):
        starts.append(fill[o])
        fill[o] += s
    return starts, n * k


def placeholder(like):
    """An array of ``like``'s shape and dtype that holds no memory (one zero, broadcast) and refuses a
    write: what a parameter's data or gradient is while ZeRO has freed it."""
    xp = backend.array_module(like)
    return xp.broadcast_to(xp.zeros((), dtype=like.dtype), like.shape)


class FlatBuffer:
    def __init__(self, params, group, compute_dtype=None, across=None, gathered=False, whole_tensors=False,
                 load=None):
        """``group``: its shard group, the ranks the buffer is cut over (a Communicator, or anything with ``size`` and
        ``rank``); ``across``: the group its owned range is all-reduced over after the reduce-scatter,
        or None; ``gathered``: the values are kept only in the owned range and gathered when used
        (ZeRO-3) - unless n = 1; ``load``: with ``whole_tensors``, the numbers each rank of the shard
        group owns in its earlier buffers (``owners``), shared by all of them."""
        xp = backend.array_module(params[0].data)
        dtype = params[0].data.dtype
        self.group, self.across, self.params = group, across, list(params)
        self.compute_dtype = compute_dtype if compute_dtype is not None else dtype
        n = group.size
        starts, self.size = layout([p.data.size for p in params], n, whole_tensors, load)
        self.segments = sorted(((p, a, a + p.data.size) for p, a in zip(params, starts)), key=lambda s: s[1])
        self.lo, self.hi = self.owned_range(group.rank, n)
        k = self.hi - self.lo
        self.resident = not gathered or n == 1
        flat = xp.zeros(self.size, dtype=dtype)                 # (size,)
        for p, a, b in self.segments:
            flat[a:b] = p.data.reshape(-1)
        self.master = flat if self.resident else flat[self.lo:self.hi].copy()     # (size,) or (k,)
        mixed = self.compute_dtype != dtype
        self.compute = (flat.astype(self.compute_dtype) if mixed else flat) if self.resident else None
        self.grad = xp.zeros(self.size, dtype=dtype) if self.resident else None
        self.owned_grad = self.grad if n == 1 else xp.zeros(k, dtype=dtype)        # (k,)
        self.gathering = None                                   # ZeRO-3's all-gather, until waited for
        self.counted = across is None or across.rank == 0       # its owned range counts in the norm here
        for p, a, b in self.segments:
            p.master = self.master[a:b].reshape(p.data.shape) if self.resident and mixed else None
            p.data = self.compute[a:b].reshape(p.data.shape) if self.resident else placeholder(p.data)
            p.grad = self.grad[a:b].reshape(p.grad.shape) if self.resident else placeholder(p.grad)

    def owned_range(self, rank, n):
        """[lo, hi): the numbers rank ``rank`` of the n in the shard group owns - the rank-th of n equal
        ranges (the whole-tensor layout pads each rank's parameters to the fullest's count).  One method, so
        that `hpcpar train --plug` can put a student's ZeRO-1 cut in its place (training/plug.py)."""
        k = self.size // n
        return rank * k, (rank + 1) * k

    @property
    def owned_master(self):
        """(k,) the master values of the owned range."""
        return self.master[self.lo:self.hi] if self.resident else self.master

    def owner(self, p):
        """The rank of the shard group that owns ``p`` whole, or None where it straddles two ranges."""
        k = self.size // self.group.size
        for q, a, b in self.segments:
            if q is p:
                return a // k if (b - 1) // k == a // k else None
        raise KeyError(p.name)

    def ranges(self, predicate):
        """(a, b) ranges of the owned range, relative to it, covered by parameters with ``predicate``."""
        out = []
        for p, a, b in self.segments:
            a, b = max(a, self.lo), min(b, self.hi)
            if a < b and predicate(p):
                out.append((a - self.lo, b - self.lo))
        return out

    def slice(self, key):
        """The FlatSlice this rank updates: its owned range."""
        whole = [(p, a - self.lo, b - self.lo) for p, a, b in self.segments if self.lo <= a and b <= self.hi]
        return FlatSlice(key, self.owned_master, self.owned_grad, self.ranges(lambda p: p.decay), whole)

    # --- the values: ZeRO-3 gathers them around a module, ZeRO-1/2 share the updated ranges -------

    @property
    def gathered(self):
        return self.compute is not None

    def start_gather(self):
        xp = backend.array_module(self.master)
        self.compute = xp.empty(self.size, dtype=self.compute_dtype)
        self.compute[self.lo:self.hi] = self.master             # (rounded to the compute dtype)
        self.gathering = self.group.iall_gather_(self.compute)

    def finish_gather(self):
        if self.gathering is not None:
            self.gathering.wait()
            self.gathering = None
        for p, a, b in self.segments:
            p.data = self.compute[a:b].reshape(p.data.shape)

    def free(self):
        """Drop the gathered values (a gather in flight is finished first: MPI still writes into it)."""
        if self.resident:
            return
        if self.gathering is not None:
            self.gathering.wait()
            self.gathering = None
        self.compute = None
        for p, _, _ in self.segments:
            p.data = placeholder(p.data)

    def share_update(self):
        """ZeRO-1/2: start the all-gather that gives every rank of the shard group the others' updated
        ranges of the masters (in place); None when there is nothing to gather."""
        return None if self.group.size == 1 else self.group.iall_gather_(self.master)

    def refresh(self):
        """Round the kept compute copy again from the master values (mixed precision; else nothing)."""
        if self.resident and self.compute is not self.master:
            self.compute[...] = self.master

    # --- the gradient ---------------------------------------------------------------------------

    def new_grad(self):
        """A zeroed full gradient again, the parameters' ``grad`` views into it."""
        xp = backend.array_module(self.master)
        self.grad = xp.zeros(self.size, dtype=self.master.dtype)
        for p, a, b in self.segments:
            p.grad = self.grad[a:b].reshape(p.grad.shape)

    def drop_grad(self):
        """Free the full gradient (ZeRO-2 and 3, once reduced); the parameters' ``grad`` become
        placeholders that refuse a write.  Over one rank it is the owned gradient: kept."""
        if self.grad is self.owned_grad:
            return
        self.grad = None
        for p, _, _ in self.segments:
            p.grad = placeholder(p.grad)

    def reduce_inside(self):
        """Start the reduce-scatter of the full gradient into ``owned_grad`` over the shard group;
        None when n = 1 (the owned gradient is the full one)."""
        return None if self.group.size == 1 else self.group.ireduce_scatter(self.grad, self.owned_grad)

    def reduce_across(self):
        """Start the all-reduce of ``owned_grad`` over ``across`` (None without one)."""
        return None if self.across is None else self.across.iall_reduce_(self.owned_grad)

    def whole(self, owned):
        """Collective over the shard group: the flat array whose owned range on each rank is its ``owned``."""
        if self.group.size == 1:
            return owned
        full = backend.array_module(owned).zeros(self.size, dtype=owned.dtype)
        full[self.lo:self.hi] = owned
        self.group.iall_gather_(full).wait()
        return full

    # --- bytes ------------------------------------------------------------------------------------

    def weight_bytes(self):
        """Weights kept between steps: the masters, and a resident buffer's compute copy."""
        copy = self.compute.nbytes if self.resident and self.compute is not self.master else 0
        return self.master.nbytes + copy

    def grad_bytes(self):
        """Gradients alive now: the owned range's, and the full buffer's while it exists."""
        full = self.grad.nbytes if self.grad is not None and self.grad is not self.owned_grad else 0
        return self.owned_grad.nbytes + full

    def gathered_bytes(self):
        """ZeRO-3's working set: the gathered values and the full gradient (a resident buffer's are state)."""
        if self.resident:
            return 0
        return (self.compute.nbytes if self.compute is not None else 0) + \
            (self.grad.nbytes if self.grad is not None else 0)
