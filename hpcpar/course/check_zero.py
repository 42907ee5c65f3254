"""ZeRO-3 exercise (docs/course/14-zero.md, docs/zero.md): gather a unit before its forward, free it after.

One rank of p is simulated: its units are laid out by the engine (hpcpar/data_parallel/flat.py's
``FlatBuffer``: the parameters end to end, padded with zeros to p k numbers, this rank keeping [rank k,
(rank + 1) k)), and the all-gather is a stand-in for ``Communicator.iall_gather_`` whose data arrives
only when the request is waited for - the latest MPI may deliver it.  Inside each unit's forward the
check looks at what the rank holds: the unit's parameters whole, the next unit's gather in flight
(prefetch), every earlier unit's gathered buffer gone.
"""
import gc
import weakref
from types import SimpleNamespace

import numpy as np

from hpcpar.course.wrong import Wrong
from hpcpar.data_parallel.flat import FlatBuffer
from hpcpar.data_parallel.fsdp import FullyShardedDataParallel
from hpcpar.nn.stage import Stage

# the units: a tanh layer each, (weight, bias) shapes; their padded sizes differ for every p checked,
# which is how the stand-in all-gather tells the units apart
LAYERS = [((3, 4), (4,)), ((4, 5), (5,)), ((5, 2), (2,))]


def zero3_forward(units, layers, x, comm):
    """Reference: the engine's own hooks (FullyShardedDataParallel.before_forward / after_forward, called
    by Stage.forward) around each layer, over units the engine lays out again from the same parameters
    and fills with this rank's slices."""
    modules = [SimpleNamespace(parameters=lambda ps=[p for p, _, _ in u.segments]: ps,
                               forward=lambda x, ctx, f=f: (f(x), None)) for u, f in zip(units, layers)]
    stage = Stage()
    stage.blocks = modules
    hooks = FullyShardedDataParallel([stage], comm)
    for engine, mine in zip(hooks.flats, units):
        engine.master[...] = mine.shard
    y, _ = stage.forward(x)
    return y


class _Request:
    """A gather in flight: the other ranks' slices land in the buffer when it is waited for."""

    def __init__(self, gather, unit, buf):
        self.gather, self.unit, self.buf, self.done = gather, unit, buf, False

    def wait(self):
        if not self.done:
            for q, shard in enumerate(self.gather.shards[self.unit]):
                if q != self.gather.rank:
                    self.buf[q * len(shard):(q + 1) * len(shard)] = shard
            self.done, self.buf = True, None


class _Gathers:
    """The communicator the student's code gets: size, rank and a non-blocking in-place all-gather that
    records, per unit, its request and a weak reference to its buffer."""

    def __init__(self, p, rank, shards, sizes, what):
        self.size, self.rank, self.shards, self.sizes, self.what = p, rank, shards, sizes, what
        self.requests, self.buffers = {}, {}                # unit -> its request, a weakref to its buffer

    def iall_gather_(self, buf):
        buf = np.asarray(buf)
        if buf.ndim != 1 or buf.size not in self.sizes:
            raise Wrong(f"{self.what}: an all-gather was posted on {buf.size} numbers (shape {buf.shape}); a "
                        "unit's flat buffer holds p k numbers, k = len(shard): its parameters, then padding")
        j = self.sizes.index(buf.size)
        if buf.dtype != self.shards[j][self.rank].dtype:
            raise Wrong(f"{self.what}: unit {j}'s gather buffer is {buf.dtype}, its shard {self.shards[j][self.rank].dtype}: "
                        "a unit is gathered in the dtype it computes in - a wider buffer moves and holds more bytes "
                        "than the shards ZeRO-3 exists to save")
        k = buf.size // self.size
        lo = self.rank * k
        if not np.array_equal(buf[lo:lo + k], self.shards[j][self.rank]):
            raise Wrong(f"{self.what}: when unit {j}'s gather is posted, the buffer's [{lo}, {lo + k}) does not "
                        f"hold this rank's shard: the all-gather sends each rank's own slice from its place "
                        "in the buffer, in rank order")
        if j in self.requests:
            raise Wrong(f"{self.what}: unit {j}'s gather was posted twice; once is enough for a forward")
        self.requests[j] = _Request(self, j, buf)
        self.buffers[j] = weakref.ref(buf.base if buf.base is not None else buf)
        return self.requests[j]

    def alive(self, j):
        """Unit j's gathered buffer, if anything still holds it."""
        ref = self.buffers.get(j)
        if ref is None or ref() is None:
            return None
        gc.collect()                        # a reference cycle is no holder
        return ref()


def _check_freed(gathers, units, j, when):
    buf = gathers.alive(j)
    if buf is None:
        return
    held = [p.name for p, _, _ in units[j].segments if isinstance(p.data, np.ndarray) and
            np.may_share_memory(p.data, buf)]
    if held:
        raise Wrong(f"{gathers.what}: {when}, parameter {held[0]} of unit {j} still views its gathered buffer: "
                    "a view keeps the whole buffer alive")
    raise Wrong(f"{gathers.what}: {when}, unit {j}'s gathered buffer is still alive: drop every reference "
                "to it after its forward")


def _scrub(sizes):
    """np.empty hands back memory just freed - here the engine's flat buffers, the right numbers: fill
    the recently freed blocks of the buffers' sizes with nan, so that a slice the code never wrote
    cannot hold the right numbers by chance."""
    blocks = [np.full(n, np.nan) for n in sizes for _ in range(8)]
    del blocks


def _run(f, p, rank, rng, dtype):
    what = f"p = {p}, rank {rank}, {np.dtype(dtype).name}"
    values = [[rng.standard_normal(s).astype(dtype) for s in shapes] for shapes in LAYERS]

    def params(j):
        return [SimpleNamespace(name=f"{'wb'[i]}{j}", data=v.copy(), grad=np.zeros_like(v))
                for i, v in enumerate(values[j])]
    # every rank's slices, laid out by the engine
    shards = [[FlatBuffer(params(j), SimpleNamespace(size=p, rank=q), gathered=True).master for q in range(p)]
              for j in range(len(LAYERS))]
    units = [FlatBuffer(params(j), SimpleNamespace(size=p, rank=rank), gathered=True) for j in range(len(LAYERS))]
    gathers = _Gathers(p, rank, shards, [u.size for u in units], what)
    given = [SimpleNamespace(shard=u.master.copy(), segments=list(u.segments)) for u in units]

    def layer(j):
        def forward(x):
            r = gathers.requests.get(j)
            if r is None:
                raise Wrong(f"{what}: unit {j}'s forward ran and its gather was never posted")
            if not r.done:
                raise Wrong(f"{what}: unit {j}'s forward ran before its gather was waited for (its "
                            "numbers may still be on the way)")
            for i, (prm, _, _) in enumerate(units[j].segments):
                if np.shape(prm.data) != values[j][i].shape or not np.array_equal(prm.data, values[j][i]):
                    raise Wrong(f"{what}: in unit {j}'s forward, parameter {prm.name} is not its whole value: "
                                f"param.data must be the gathered buffer's [a, b), shaped {values[j][i].shape}")
            for i in range(j):
                _check_freed(gathers, units, i, f"when unit {j}'s forward starts")
            if j + 1 < len(LAYERS):
                nxt = gathers.requests.get(j + 1)
                if nxt is None:
                    raise Wrong(f"{what}: unit {j + 1}'s gather was not posted before unit {j} computed: post "
                                "it before, so that it travels while this unit computes (prefetch)")
                if nxt.done:
                    raise Wrong(f"{what}: unit {j + 1}'s gather was already waited for when unit {j} computed: "
                                "wait for it only when its own forward starts")
            w, b = (prm.data for prm, _, _ in units[j].segments)
            return np.tanh(x @ w + b)
        return forward
    x = rng.standard_normal((2, LAYERS[0][0][0])).astype(dtype)
    want = x
    for w, b in values:
        want = np.tanh(want @ w + b)
    _scrub(gathers.sizes)
    got = f(given, [layer(j) for j in range(len(LAYERS))], x.copy(), gathers)
    for j in range(len(LAYERS)):
        _check_freed(gathers, units, j, "after the forward")
    got = np.asarray(got)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    if got.shape != want.shape or not np.allclose(got, want, rtol=tol, atol=tol):
        raise Wrong(f"{what}: the output (shape {got.shape}) is not the last layer's: return what the last "
                    "unit's forward gave")


def check_zero3_forward(f):
    rng = np.random.default_rng(23)
    # float64 shards, then float32 ones (the engine gathers in the compute dtype: bf16, fp16 or fp32)
    for p, ranks, dtype in ((2, (0, 1), np.float64), (3, (0, 1, 2), np.float64), (4, (0, 3), np.float64),
                            (2, (1,), np.float32), (3, (2,), np.float32)):
        for rank in ranks:
            _run(f, p, rank, rng, dtype)
