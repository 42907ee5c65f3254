"""Where a training step's milliseconds go, by category: ``hpcpar train --profile``.

    GEMM            the projections' and the output layer's matrix products (ops/linear.py, and any
                    other call of precision.gemm outside attention)
    fp8 quantise    an FP8/FP4 recipe's quantisation of the GEMM inputs (fp8/gemm.py), amax reductions
                    included
    attention       the attention core: its batched Q K^T and P V products, scale, mask, head reshapes
                    (ring attention's blocks and grouped-query K/V repeats too)
    elementwise     LayerNorm, GELU, softmax, dropout, residual sums - every other op of hpcpar/ops
    embedding/loss  table lookups and their scatter-add, cross-entropy
    optimizer       the update (Muon's Newton-Schulz iterations; QK-clip), the gradient norm (clipping),
                    zeroing the gradients
    data            drawing the batch
    comm <axis>     time inside a communicator of that axis (tp, pp, dp, world, ...), waits included:
                    a pipeline stage waiting for its neighbour (the bubble: idle) counts under pp
    other           the rest of the step: Python between the ops, copies and temporaries in nn/

Each category's time is *exclusive*: a softmax inside attention counts as elementwise, not twice.  So
the categories add up to the step, whose wall time the loop measures around ``Trainer.step``.

How: ``install`` replaces, in every loaded hpcpar module, the functions it categorises by a timing
wrapper (a few hundred calls a step, about a microsecond each), and ``remove`` puts them back.  Nothing
in the ops knows about it, and an op added later is timed as elementwise without being named here.

The GEMM floor: in one extra step (``step(floor=True)``, not counted) every GEMM is repeated twice
right after it ran, on the same arrays, and the faster repeat is kept: the step's own GEMMs timed
alone, warm, with nothing between them.  ``step time / floor`` is how far the engine is from a step
that would be nothing but its GEMMs.  ``gemm_seconds`` sums the counted steps' GEMMs as they ran (both
categories, cold caches and all): the figure to set beside another engine's GEMM time in its step.
"""
import functools
import inspect
import sys
import time
from contextlib import contextmanager

from hpcpar import optim, precision
from hpcpar.fp8.gemm import QuantisedGemms
from hpcpar.comm import communicator, requests
from hpcpar.data_parallel.protocol import Replicas

OPS_CATEGORY = {"hpcpar.ops.linear": "GEMM", "hpcpar.ops.attention": "attention",
                "hpcpar.ops.ring_attention": "attention", "hpcpar.ops.gqa": "attention",
                "hpcpar.ops.embedding": "embedding/loss", "hpcpar.ops.cross_entropy": "embedding/loss"}
CATEGORIES = ("GEMM", "fp8 quantise", "attention", "elementwise", "embedding/loss", "optimizer", "data")
COMM_METHODS = ("all_reduce", "all_reduce_", "iall_reduce_", "all_gather", "reduce_scatter", "ireduce_scatter",
                "all_to_all", "all_to_allv", "iall_gather_", "bcast_", "barrier", "send", "recv_", "isend", "irecv_",
                "sendrecv")


def op_functions():
    """{function: category} of every public function defined in hpcpar/ops (generators excepted)."""
    out = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("hpcpar.ops.") or module is None:
            continue
        for attr, fn in vars(module).items():
            if inspect.isfunction(fn) and fn.__module__ == name and not attr.startswith("_") \
                    and not inspect.isgeneratorfunction(fn):
                out[fn] = OPS_CATEGORY.get(name, "elementwise")
    return out


class Profiler:
    def __init__(self, clock=time.perf_counter, detail=False):
        """``clock``: wall time by default; a benchmark on a busy machine may pass time.process_time
        (one rank only: a rank waiting in MPI spins, so its CPU time says nothing about waits).
        ``detail``: each op its own row ("elementwise: gelu_forward"), to find the one to speed up."""
        self.clock, self.detail = clock, detail
        self.seconds = {}               # category -> exclusive seconds over the counted steps
        self.step_seconds = 0.0         # wall time of the counted steps
        self.steps = 0
        self.floor_seconds = None       # the GEMMs of the floor step, timed alone
        self.gemm_seconds = 0.0         # the GEMMs inside the counted steps, both categories (GEMM, attention's)
        self._stack = []                # per open call: seconds spent in its timed callees
        self._counting = False
        self._floor = False
        self._undo = []                 # (owner, name, original) to put back

    # --- the wrappers -------------------------------------------------------------------------

    def _timed(self, fn, category):
        """fn, with its exclusive time added to ``category`` (a name, or a function of the call's
        arguments giving one) while a step is counted."""
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not self._counting:
                return fn(*args, **kwargs)
            start = self.clock()
            self._stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                spent = self.clock() - start
                inner = self._stack.pop()
                name = category if isinstance(category, str) else category(args)
                self.seconds[name] = self.seconds.get(name, 0.0) + spent - inner
                if self._stack:
                    self._stack[-1] += spent
        return call

    def _gemm(self, fn):
        """precision.gemm: GEMM, or attention's inside the attention core, its time also summed over both
        in ``gemm_seconds``; in the floor step it also times two repeats of itself (same arrays, same
        result written again; a GEMM that adds into its ``out``, a gradient, repeats into a copy of it)."""
        counted = self._timed(fn, lambda args: "attention" if self._in_attention else "GEMM")

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not self._floor:
                if not self._counting:
                    return fn(*args, **kwargs)
                start = self.clock()
                try:
                    return counted(*args, **kwargs)
                finally:
                    self.gemm_seconds += self.clock() - start
            out = fn(*args, **kwargs)
            if kwargs.get("add"):
                kwargs = dict(kwargs, out=kwargs["out"].copy())
            repeats = []
            for _ in range(2):
                start = self.clock()
                fn(*args, **kwargs)
                repeats.append(self.clock() - start)
            self.floor_seconds += min(repeats)
            return out
        return call

    def _attention(self, fn):
        timed = self._timed(fn, "attention")

        @functools.wraps(fn)
        def call(*args, **kwargs):
            outer, self._in_attention = self._in_attention, True
            try:
                return timed(*args, **kwargs)
            finally:
                self._in_attention = outer
        return call

    _in_attention = False

    # --- install and remove -------------------------------------------------------------------

    def _replace(self, owner, name, new):
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def install(self, communicators=()):
        """Wrap the categorised functions wherever a loaded hpcpar module holds them; returns self.
        ``communicators``: those whose pending requests are to be named by axis (Grid.communicators())."""
        for c in communicators:
            _names[id(c.stats)] = c.name
        wrapped = {fn: (self._attention(fn) if cat == "attention" else
                        self._timed(fn, f"{cat}: {fn.__name__}" if self.detail else cat))
                   for fn, cat in op_functions().items()}
        wrapped[precision.gemm] = self._gemm(precision.gemm)
        wait_all = requests.wait_all
        wrapped[wait_all] = self._timed(wait_all, lambda args: _axis_of_requests(args[0]))
        from hpcpar.training.step import Trainer
        wrapped[Trainer._contexts_and_batches] = self._timed(Trainer._contexts_and_batches, "data")
        for name, module in list(sys.modules.items()):
            if name.startswith("hpcpar") and module is not None:
                for attr, value in list(vars(module).items()):
                    if inspect.isfunction(value) and value in wrapped:
                        self._replace(module, attr, wrapped[value])
        self._replace(Trainer, "_contexts_and_batches", wrapped[Trainer._contexts_and_batches])
        from hpcpar.optim.muon import Muon
        from hpcpar.training.qk_clip import QKClip
        for cls in (optim.SGD, optim.AdamW, Muon, QKClip):          # (Muon's Newton-Schulz included)
            self._replace(cls, "step", self._timed(cls.step, "optimizer"))
        self._replace(QuantisedGemms, "quantise", self._timed(QuantisedGemms.quantise, "fp8 quantise"))
        for method in ("norm_sq", "zero_grad"):
            self._replace(Replicas, method, self._timed(getattr(Replicas, method), "optimizer"))
        for method in COMM_METHODS:
            self._replace(communicator.Communicator, method, self._timed(
                getattr(communicator.Communicator, method), lambda args: f"comm {args[0].name}"))
        for method in ("wait", "test"):
            self._replace(requests.Request, method, self._timed(
                getattr(requests.Request, method), lambda args: _axis_of_requests([args[0]])))
        return self

    def remove(self):
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    # --- steps --------------------------------------------------------------------------------

    @contextmanager
    def step(self, floor=False):
        """Count the step run inside (or, with ``floor``, measure its GEMM floor instead)."""
        if floor:
            self._floor, self.floor_seconds = True, 0.0
            try:
                yield
            finally:
                self._floor = False
            return
        self._counting = True
        start = self.clock()
        try:
            yield
        finally:
            self._counting = False
            self.step_seconds += self.clock() - start
            self.steps += 1

    def per_step(self):
        """{category: seconds per counted step}, "other" the rest, and "step" the step itself."""
        n = max(1, self.steps)
        out = {c: s / n for c, s in sorted(self.seconds.items(), key=lambda kv: _order(kv[0]))}
        out["other"] = out.get("other", 0.0) + self.step_seconds / n - sum(out.values())
        out["step"] = self.step_seconds / n
        if self.floor_seconds is not None:
            out["gemm_floor"] = self.floor_seconds
        return out


_names = {}             # id(Stats) -> its communicator's name: a Request knows only its Stats


def _axis_of_requests(reqs):
    for r in reqs:
        if r is not None and id(r.stats) in _names:
            return f"comm {_names[id(r.stats)]}"
    return "other"                  # nothing to wait for (a pipeline of one stage sends nothing)


def _order(category):
    main = category.split(":")[0]
    return (CATEGORIES.index(main) if main in CATEGORIES else len(CATEGORIES), category)


def report(per_rank):
    """Text table of a profile: per category the mean over ranks of ms per step, and its share.
    ``per_rank``: the ``per_step()`` dict of every rank."""
    keys = [k for k in per_rank[0] if k not in ("step", "gemm_floor")]
    for d in per_rank[1:]:
        keys += [k for k in d if k not in keys and k not in ("step", "gemm_floor")]
    keys.sort(key=lambda k: (k == "other", _order(k)))

    def mean(key):
        return sum(d.get(key, 0.0) for d in per_rank) / len(per_rank)
    step = mean("step")
    width = max(len(k) for k in keys + ["step"]) + 2
    lines = [f"profile: one step, mean over {len(per_rank)} rank{'s' if len(per_rank) > 1 else ''}"]
    lines += [f"  {k:<{width}}{mean(k) * 1e3:>10.2f} ms  ({mean(k) / step:.1%} of the step)" for k in keys]
    lines.append(f"  {'step':<{width}}{step * 1e3:>10.2f} ms")
    if all("gemm_floor" in d for d in per_rank):
        floor = mean("gemm_floor")
        lines.append(f"  GEMM floor (the step's GEMMs timed alone): {floor * 1e3:.2f} ms; "
                     f"the step takes {step / floor:.2f}x its floor")
    return "\n".join(lines)
