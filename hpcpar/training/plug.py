"""Your own code in the trainer: ``hpcpar train --plug FILE`` (docs/course/README.md, "Your code in the trainer").

FILE is a Python file.  Each group of names below that it defines takes the place of the engine's own
piece for the whole run; the rest of the trainer - the grid, the model, the schedule's engine, the
optimizer - is the package's.  In float64 a right answer prints the losses of one rank to round-off.

  column_forward(x, w, b, comm) -> y              tensor parallelism's layer pair (every GPT-2 block's
  column_backward(dy, x, w, comm) -> dx, dw, db   c_attn, c_fc: column-parallel; its two c_proj:
  row_forward(x, w, b, comm) -> y                 row-parallel), replacing tensor_parallel/layers.py's
  row_backward(dy, x, w, comm) -> dx, dw, db      GEMMs and region crossings (not --sequence-parallel)
  one_f_one_b(stage, stages, microbatches)        the 1F1B order: [("F", mb), ("B", mb), ...]
  zero1_shard(numel, dp, rank) -> lo, hi          ZeRO-1's range of a padded bucket (--zero 1)
  ring_attention_forward(qs, k, v, positions,     ring attention's forward (--cp): this rank's O and
                         comm, attend) -> o, lse  lse over every rank's key/value block
  expert_dispatch(rows, counts, comm)             expert parallelism's all-to-alls (--ep): the rows to
      -> xe, local_offsets, plan                  the ranks of their experts and back; the backward
  expert_combine(rows, plan, comm) -> rows        sends the gradients the same two ways

The course's exercises 6, 7, 30, 31 and 32 ask for these functions; their checks run the trainer with
them on 2 to 4 MPI ranks (hpcpar/course/plugged.py) and compare the losses with one rank's.
"""
import contextlib
import functools
from dataclasses import replace
from pathlib import Path

import numpy as np

from hpcpar.runtime import UsageError

GROUPS = {"tensor-parallel layers": ("column_forward", "column_backward", "row_forward", "row_backward"),
          "1F1B order": ("one_f_one_b",), "ZeRO-1 shard": ("zero1_shard",),
          "ring attention": ("ring_attention_forward",), "expert dispatch": ("expert_dispatch", "expert_combine")}


def load(path):
    """The plug file as a module (refused with one line when it is missing or defines no hook)."""
    import importlib.util
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--plug: {path} not found")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chosen(module):
    """The hook groups ``module`` fills, whole; one line refuses a group half written."""
    groups = []
    for group, names in GROUPS.items():
        there = [n for n in names if callable(getattr(module, n, None))]
        if there and len(there) < len(names):
            raise UsageError(f"--plug: {group} needs {', '.join(names)}; the file defines only {', '.join(there)}")
        if there:
            groups.append(group)
    if not groups:
        raise UsageError(f"--plug: the file defines none of {', '.join(n for ns in GROUPS.values() for n in ns)}")
    return groups


@contextlib.contextmanager
def plugged(module):
    """Within the block, the engine runs ``module``'s functions in place of its own pieces."""
    undo = install(module)
    try:
        yield
    finally:
        undo()


def install(module):
    """Put ``module``'s functions in place for the whole process; returns the function that undoes it."""
    patches = []                                 # (owner, attribute, the engine's own value)

    def put(owner, attr, value):
        patches.append((owner, attr, owner[attr] if isinstance(owner, dict) else getattr(owner, attr)))
        if isinstance(owner, dict):
            owner[attr] = value
        else:
            setattr(owner, attr, value)
    for group in chosen(module):
        INSTALLERS[group](module, put)

    def undo():
        for owner, attr, value in reversed(patches):
            if isinstance(owner, dict):
                owner[attr] = value
            else:
                setattr(owner, attr, value)
    return undo


def _tensor_parallel(m, put):
    from hpcpar.nn.module import run_or_defer
    from hpcpar.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from hpcpar.tensor_parallel.regions import reduce_from_region
    own = {cls: (cls.forward, cls.backward) for cls in (ColumnParallelLinear, RowParallelLinear)}

    def accumulate(layer, dw, db, defer):
        def add():
            layer.weight.grad += dw
            if layer.bias is not None:
                layer.bias.grad += db
        run_or_defer(add, defer)

    # fp32 (a low precision's unrounded sum, ops/linear.py): the plugged runs are float64, where it is moot
    def column_forward(self, x, ctx=None, fp32=False):
        if self.sp:                                  # sequence parallelism: the engine's own
            return own[ColumnParallelLinear][0](self, x, ctx, fp32)
        return m.column_forward(x, self.weight.data, self.bias and self.bias.data, self.comm), x

    def column_backward(self, dy, x, defer=None):
        if self.sp:
            return own[ColumnParallelLinear][1](self, dy, x, defer)
        dx, dw, db = m.column_backward(dy, x, self.weight.data, self.comm)
        accumulate(self, dw, db, defer)
        return dx

    def row_forward(self, x, ctx=None):
        if self.region is not reduce_from_region:        # sequence parallelism
            return own[RowParallelLinear][0](self, x, ctx)
        return m.row_forward(x, self.weight.data, self.bias and self.bias.data, self.comm), x

    def row_backward(self, dy, x, defer=None, fp32=False):
        if self.region is not reduce_from_region:        # sequence parallelism
            return own[RowParallelLinear][1](self, dy, x, defer, fp32)
        dx, dw, db = m.row_backward(dy, x, self.weight.data, self.comm)
        accumulate(self, dw, db, defer)
        return dx
    for cls, forward, backward in ((ColumnParallelLinear, column_forward, column_backward),
                                   (RowParallelLinear, row_forward, row_backward)):
        put(cls, "forward", forward)
        put(cls, "backward", backward)


def _one_f_one_b(m, put):
    from hpcpar.pipeline.schedules import KINDS, Action

    def order(rank, p, microbatches, v):
        return [Action(str(op), int(mb)) for op, mb in m.one_f_one_b(rank, p, microbatches)]
    put(KINDS, "1f1b", replace(KINDS["1f1b"], order=order))


def _zero1_shard(m, put):
    from hpcpar.data_parallel.flat import FlatBuffer

    def owned_range(self, rank, n):
        numel = self.segments[-1][2] if self.segments else 0          # the parameters, not the padding
        lo, hi = m.zero1_shard(numel, n, rank)
        return int(lo), int(hi)
    put(FlatBuffer, "owned_range", owned_range)


def _ring_attention(m, put):
    from hpcpar.context_parallel.ring import RingAttention
    from hpcpar.ops.ring_attention import block_forward
    put(RingAttention, "ring_forward",                  # documents' masks ride along, unseen by the student
        lambda self, qs, k, v, pos, attn_mask=None, logits=None: m.ring_attention_forward(
            qs, k, v, pos, self.comm, functools.partial(block_forward, attn_mask=attn_mask)))


def _expert_dispatch(m, put):
    from hpcpar.expert_parallel.dispatch import ExpertParallel

    def forward(self, experts, xs, offsets, ctx=None):
        counts = np.diff(np.asarray(offsets, dtype=np.int64))                   # (E,) rows per expert
        xe, local, plan = m.expert_dispatch(xs, counts, self.comm)
        ye, c_exp = experts.forward(xe, [int(o) for o in local], ctx)
        return m.expert_combine(ye, plan, self.comm), (c_exp, counts, plan)

    def backward(self, experts, dys, cache, defer=None):
        c_exp, counts, plan = cache
        dye = m.expert_dispatch(dys, counts, self.comm)[0]                     # the gradients, the same way
        return m.expert_combine(experts.backward(dye, c_exp, defer), plan, self.comm)
    put(ExpertParallel, "forward", forward)
    put(ExpertParallel, "backward", backward)


INSTALLERS = {"tensor-parallel layers": _tensor_parallel, "1F1B order": _one_f_one_b,
              "ZeRO-1 shard": _zero1_shard, "ring attention": _ring_attention, "expert dispatch": _expert_dispatch}
