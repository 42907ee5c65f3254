"""Flat parameter and gradient buffers, cut into buckets.

Every parameter of a rank lives inside a few large contiguous arrays: ``p.data`` and ``p.grad`` become
views into a bucket's ``data`` and ``grad``.  That makes three things cheap:

* data parallelism reduces a whole bucket with one MPI call on one contiguous buffer, as soon as all
  of its gradients are final (buckets are filled in backward order, so the first ones finish first,
  and cut where the backward reports gradients, so that none waits for the next report);
* ZeRO-1 cuts each bucket into ``dp`` equal ranges (buckets are padded to a multiple of ``dp``), and a
  rank updates only its own range;
* the optimizer updates a bucket with a handful of vectorised operations instead of one per tensor.

Under mixed precision (hpcpar/precision.py) ``data`` holds the fp32 master weights and ``compute`` a
low-precision copy of them, rounded again after every update (``refresh``); ``p.data`` views the
compute copy, ``p.master`` the masters.  Gradients stay in ``grad``, fp32.  Otherwise ``compute`` is
``data``.

What a rank hands the optimizer is a ``FlatSlice`` of each bucket: the whole bucket, or its ZeRO range.
"""
from hpcpar import backend


class FlatSlice:
    """A flat slice of parameters that one rank updates: data and grad views, decayed (a, b) ranges
    relative to the slice, the key under which the optimizer keeps its state, and ``segments``: the
    (param, a, b) lying whole in the slice."""

    def __init__(self, key, data, grad, decay_ranges, segments=()):
        self.key, self.data, self.grad, self.decay_ranges = key, data, grad, decay_ranges
        self.segments = list(segments)

    def tensors(self):
        """[(param, data, grad)] of the parameters whole in this slice, shaped as the parameter."""
        return [(p, self.data[a:b].reshape(p.data.shape), self.grad[a:b].reshape(p.data.shape))
                for p, a, b in self.segments]


def whole_in(segments, lo, hi):
    """The (param, a, b) of ``segments`` lying whole in [lo, hi), relative to lo."""
    return [(p, a - lo, b - lo) for p, a, b in segments if lo <= a and b <= hi]


class Bucket:
    def __init__(self, params, align, compute_dtype=None):
        xp = backend.array_module(params[0].data)
        dtype = params[0].data.dtype
        n = sum(p.data.size for p in params)
        self.size = -(-n // align) * align                      # padded to a multiple of `align`
        self.data = xp.zeros(self.size, dtype=dtype)            # (size,)
        self.grad = xp.zeros(self.size, dtype=dtype)            # (size,)
        mixed = compute_dtype is not None and compute_dtype != dtype
        self.compute = xp.zeros(self.size, dtype=compute_dtype) if mixed else self.data     # (size,)
        self.segments = []                                      # (param, start, stop)
        start = 0
        for p in params:
            stop = start + p.data.size
            self.data[start:stop] = p.data.reshape(-1)
            self.grad[start:stop] = p.grad.reshape(-1)
            if mixed:
                p.master = self.data[start:stop].reshape(p.data.shape)
            p.data = self.compute[start:stop].reshape(p.data.shape)
            p.grad = self.grad[start:stop].reshape(p.grad.shape)
            self.segments.append((p, start, stop))
            start = stop
        self.params = list(params)
        self.refresh()

    def drop_grad(self):
        """Free the full gradient buffer (ZeRO-2, after its reduce-scatter); the parameters' ``grad``
        become placeholders that refuse a write."""
        self.grad = None
        for p, _, _ in self.segments:
            p.grad = placeholder(p.grad)

    def new_grad(self):
        """A zeroed full gradient buffer again, the parameters' ``grad`` views into it."""
        xp = backend.array_module(self.data)
        self.grad = xp.zeros(self.size, dtype=self.data.dtype)
        for p, a, b in self.segments:
            p.grad = self.grad[a:b].reshape(p.grad.shape)

    def refresh(self):
        """Round the master weights into the compute copy (mixed precision; else nothing to do)."""
        if self.compute is not self.data:
            self.compute[...] = self.data

    def zero_range(self, index, parts):
        """[lo, hi) of the range DP rank ``index`` of ``parts`` owns under ZeRO-1."""
        k = self.size // parts
        return index * k, (index + 1) * k

    def ranges(self, lo, hi, predicate):
        """Parts of [lo, hi) covered by parameters for which ``predicate(p)`` holds, as (a, b) pairs."""
        out = []
        for p, a, b in self.segments:
            a, b = max(a, lo), min(b, hi)
            if a < b and predicate(p):
                out.append((a, b))
        return out


def placeholder(like):
    """An array of ``like``'s shape and dtype that holds no memory (one zero, broadcast) and refuses a
    write: what a parameter's data or gradient is while ZeRO has freed it."""
    xp = backend.array_module(like)
    return xp.broadcast_to(xp.zeros((), dtype=like.dtype), like.shape)


def make_buckets(groups, bucket_bytes, align=1, compute_dtype=None):
    """Bucket the parameter ``groups`` (lists of parameters final at the same moment, in the order they
    become final) in that order, each bucket about ``bucket_bytes``.  A bucket holds whole groups while
    they fit: one that does not fit starts a new bucket, because a bucket spanning two groups could
    not start before the later one is final.  A group larger than ``bucket_bytes`` is cut into buckets
    of its own (never splitting a parameter); they start together."""
    buckets, current, size = [], [], 0

    def close():
        nonlocal current, size
        if current:
            buckets.append(Bucket(current, align, compute_dtype))
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
