"""The module protocol: explicit caches instead of an autograd graph.

    y, cache = module.forward(x, ctx)
    dx = module.backward(dy, cache)                  # accumulates into every parameter's .grad
    dx = module.backward(dy, cache, defer=work)      # dx now; weight gradients queued in `work`
    for fn in work: fn()                             # ... and computed later (a "W" pass)

A cache is a plain value, so any number of micro-batches can be in flight at once (1F1B), a cache
can be dropped and recomputed from the input (activation recomputation), and the weight-gradient half
of backward can wait (zero-bubble schedules).
"""
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Context:
    """Facts about the current micro-batch that a few layers need (dropout, sequence parallelism).

    step          optimizer step (dropout masks change every step)
    sample_ids    global indices of this micro-batch's samples in the step's batch (dropout keys)
    seed          the run's seed
    training      False disables dropout
    seq_slice     with sequence parallelism, the positions of the full sequence this rank holds
    seq_len       ... and the length of the full sequence
    positions     the global positions (T_local,) of the tokens this rank holds: those attention sees
                  (rotary embeddings) and the position table adds; None: 0 .. T-1 (context parallelism
                  gives each rank two chunks of the sequence)
    loss_scale    d(step's loss) / d(this micro-batch's loss sum), 1 / tokens in the global batch: the
                  weight of a loss a layer adds itself (the MoE load-balancing loss, nn/moe.py)
    docs          with --documents, the document id (B, T) of every position of the whole window
                  (ops/masks.py: attention's rule, positions restarting); None: one document
    keep          ... and which of this rank's targets (B, T_local) stay in the loss; None: all
    cp_positions  every cp rank's positions (its ``positions``), when they are not the causal balance
    """
    step: int = 0
    sample_ids: Any = None
    seed: int = 0
    training: bool = True
    seq_slice: Any = None
    seq_len: int = 0
    positions: Any = None
    loss_scale: float = 0.0
    docs: Any = None
    keep: Any = None
    cp_positions: Any = None


class Module:
    """Base class: parameter discovery and gradient zeroing. Subclasses define forward/backward."""

    def parameters(self):
        """Every Parameter reachable through attributes, in definition order, each once."""
        from hpcpar.nn.parameter import Parameter
        seen, out = set(), []

        def visit(obj):
            if isinstance(obj, Parameter):
                if id(obj) not in seen:
                    seen.add(id(obj))
                    out.append(obj)
            elif isinstance(obj, Module):
                for value in vars(obj).values():
                    visit(value)
            elif isinstance(obj, (list, tuple)):
                for value in obj:
                    visit(value)

        visit(self)
        return out

    def zero_grad(self):
        for p in self.parameters():
            p.grad[...] = 0


def run_or_defer(fn, defer):
    """Compute a weight gradient now, or queue it for a later W pass."""
    if defer is None:
        fn()
    else:
        defer.append(fn)


def cache_bytes(cache):
    """Bytes of the distinct arrays reachable from a cache (views of one buffer counted once)."""
    seen, total = set(), 0

    def visit(obj):
        nonlocal total
        if isinstance(obj, np.ndarray):
            base = obj
            while base.base is not None and isinstance(base.base, np.ndarray):
                base = base.base
            if id(base) not in seen:
                seen.add(id(base))
                total += base.nbytes
        elif isinstance(obj, (tuple, list)):
            for item in obj:
                visit(item)
    visit(cache)
    return total
