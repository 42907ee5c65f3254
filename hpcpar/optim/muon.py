"""Muon for the blocks' weight matrices, AdamW for everything else, from one learning rate.

Muon (Jordan 2024; Liu et al. 2025, Moonlight; PyTorch's torch.optim.Muon) updates a matrix W (shaped
as nn.Linear holds it: rows = outputs, cols = inputs) by its orthogonalised Nesterov momentum:

    M <- mu M + (1 - mu) G                        the momentum buffer (PyTorch's lerp form)
    U  = (1 - mu) G + mu M                        Nesterov
    O  = newton_schulz(U)                         every singular value about 1 (newton_schulz.py)
    W <- W (1 - lr wd) - lr s O                   decoupled weight decay, then the step

with the shape's scale s: ``moonlight`` 0.2 sqrt(max(rows, cols)), which gives O the update RMS of
AdamW (about 0.2), so one --lr serves both groups (PyTorch's adjust_lr_fn "match_rms_adamw");
``keller`` sqrt(max(1, rows / cols)) (PyTorch's "original").

Which parameters: the blocks' weights of two or more dimensions - attention projections, MLP, and
the experts, one matrix per expert - except a router (``Parameter.matrix``, set by the stage,
nn/stage.py); embeddings, the output head, norms, biases and routers take AdamW, the split Moonlight
and Kimi K2 use.  A fused weight is orthogonalised per matrix: GPT-2's c_attn [Q | K | V] as Q, K and
V, an expert's [gate | up] as gate and up (``Parameter.fused`` column blocks), as the published
recipes do for their separate matrices.

On flat slices (optim/__init__.py): a slice holds whole matrices (``FlatSlice.segments``) and other
numbers; Muon keeps a momentum buffer for the matrices and hands the rest, range by range, to AdamW
with its two moments: its state is (momentum over the matrices' numbers, exp_avg and exp_avg_sq over
the rest's), one array of each per slice.  ``orthogonalise(p, U)`` is newton_schulz on each of p's
matrices here; under tensor parallelism, where p is a shard, tensor_parallel/muon.py's modes.
"""
import math

from hpcpar.backend import array_module
from hpcpar.flops import newton_schulz_flops
from hpcpar.optim.newton_schulz import COEFFICIENTS, newton_schulz

SCALES = ("moonlight", "keller")


def scale(rows, cols, kind="moonlight"):
    """The update's scale for a (rows, cols) matrix (rows = outputs, as nn.Linear holds it)."""
    if kind == "moonlight":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1.0, rows / cols))


def matrix_shape(p):
    """(rows, cols) of each of p's whole matrices, counted as nn.Linear holds one: (outputs, inputs).
    hpcpar holds a weight (in, out), an expert's (E, in, out); ``fused`` matrices side by side."""
    return p.full_shape[-1] // p.fused, p.full_shape[-2]


def matrices(p, x):
    """Views of each matrix Muon orthogonalises apart in x, an array of p's local shape: one (in, out)
    block per expert and per fused column block."""
    xp = array_module(x)
    return [m for e in x.reshape(-1, *x.shape[-2:]) for m in xp.split(e, p.fused, axis=1)]


class NewtonSchulz:
    """The iteration's settings (steps, coefficients, dtype) and what it ran (``flops``)."""

    def __init__(self, steps=5, dtype=None, coefficients=COEFFICIENTS):
        self.steps, self.dtype, self.coefficients = steps, dtype, coefficients
        self.flops = 0                      # counted by the caller, per matrix (flops.newton_schulz_flops)

    def __call__(self, g):
        return newton_schulz(g, self.steps, self.coefficients, dtype=self.dtype)


def orthogonalise_whole(p, u, ns):
    """O for a parameter whose matrices this rank holds whole: newton_schulz on each (a new array)."""
    out = array_module(u).empty_like(u)
    for m, o in zip(matrices(p, u), matrices(p, out)):
        o[...] = ns(m)
        ns.flops += newton_schulz_flops(min(m.shape), max(m.shape), ns.steps)
    return out


class Muon:
    state_names = ("momentum_buffer", "exp_avg", "exp_avg_sq")

    def __init__(self, adamw, momentum=0.95, nesterov=True, ns=None, scale_kind="moonlight", orthogonalise=None):
        """``adamw``: the AdamW (optim/__init__.py) that updates the rest, its weight decay Muon's too;
        ``orthogonalise(ps, Us)``: O of each parameter p's local update U, a list (default: their matrices
        held whole; one call a slice, so that tensor parallelism sends one message a slice, not a matrix)."""
        self.momentum, self.nesterov, self.scale_kind = momentum, nesterov, scale_kind
        self.weight_decay = adamw.weight_decay
        self.ns = ns or NewtonSchulz()
        self.adamw = adamw
        self.orthogonalise = orthogonalise or (lambda ps, us: [orthogonalise_whole(p, u, self.ns)
                                                               for p, u in zip(ps, us)])
        self.state, self.t = {}, 0          # state[slice key] = {"momentum_buffer": (M,), "exp_avg": (R,), ...}
        self._pending = {}                  # slice key -> whole-slice arrays loaded from a checkpoint
        self._layouts = {}                  # slice key -> (its size, {state name: the ranges it covers})

    def step(self, slices, lr):
        self.t += 1
        self.adamw.t = self.t
        c1, c2 = 1 - self.adamw.b1 ** self.t, 1 - self.adamw.b2 ** self.t
        for s in slices:
            mats, rest = layout(s)
            st = self._state(s, mats, rest)
            at = 0
            for a, b in rest:                                       # AdamW, range by range
                part = _Range(s, a, b)
                self.adamw.update(part, st["exp_avg"][at:at + b - a], st["exp_avg_sq"][at:at + b - a], lr, c1, c2)
                at += b - a
            at, us = 0, []
            for p, a, b in mats:
                us.append(self._momentum(s.grad[a:b], st["momentum_buffer"][at:at + b - a]).reshape(p.data.shape))
                at += b - a
            for (p, a, b), o in zip(mats, self.orthogonalise([p for p, _, _ in mats], us)):
                w = s.data[a:b].reshape(p.data.shape)
                if p.decay and self.weight_decay:
                    w *= 1 - lr * self.weight_decay                 # decoupled weight decay
                o *= lr * scale(*matrix_shape(p), self.scale_kind)
                w -= o                                              # W = W - lr s O

    def _momentum(self, g, m):
        """The momentum buffer m moved by the gradient g (in place); the update U to orthogonalise."""
        mu = self.momentum
        m *= mu
        m += (1 - mu) * g                                           # M = mu M + (1 - mu) G
        return (1 - mu) * g + mu * m if self.nesterov else m.copy()     # U = (1 - mu) G + mu M

    def _state(self, s, mats, rest):
        """The slice's state: created zero, or packed from a checkpoint's whole-slice arrays."""
        if s.key not in self.state:
            xp = array_module(s.data)
            whole = self._pending.pop(s.key, None)
            mine = {"momentum_buffer": [(a, b) for _, a, b in mats], "exp_avg": rest, "exp_avg_sq": rest}
            self.state[s.key] = {n: (xp.concatenate([whole[n][a:b] for a, b in r] or [xp.zeros(0, s.data.dtype)])
                                     if whole and n in whole else xp.zeros(sum(b - a for a, b in r), s.data.dtype))
                                 for n, r in mine.items()}
            self._layouts[s.key] = (s.data.size, mine)
        return self.state[s.key]

    # --- checkpoints: whole-slice arrays, as AdamW keeps them (checkpoint/pieces.py) -------------

    def flat_state(self, key):
        """{state name: an array over the whole slice} (zero where the name does not apply), or None."""
        if key in self._pending:
            return self._pending[key]
        if key not in self.state:
            return None
        size, mine = self._layouts[key]
        out = {}
        for n, ranges in mine.items():
            src = self.state[key][n]
            out[n] = array_module(src).zeros(size, src.dtype)
            at = 0
            for a, b in ranges:
                out[n][a:b] = src[at:at + b - a]
                at += b - a
        return out

    def load_flat_state(self, key, arrays):
        """Take whole-slice arrays (from a checkpoint); packed at the next step, when the slice is seen."""
        self.state.pop(key, None)
        self._pending[key] = arrays

    def clear_state(self):
        self.state.clear()
        self._pending.clear()

    @staticmethod
    def holds(p, name):
        """Whether parameter p has state ``name``: the momentum for a matrix, AdamW's moments otherwise."""
        return (name == "momentum_buffer") == bool(p.matrix)


def layout(s):
    """(matrices [(p, a, b)], the other parameters' ranges [(a, b)], adjacent ones joined) of the parameters
    whole in flat slice s: all of them, ZeRO or not, for Muon keeps each matrix whole on one rank
    (--whole-tensors, data_parallel/flat.py); a slice's padding is nobody's and keeps no state."""
    mats, rest = [], []
    for p, a, b in sorted(s.segments, key=lambda seg: seg[1]):
        if p.matrix:
            mats.append((p, a, b))
        elif rest and rest[-1][1] == a:
            rest[-1] = (rest[-1][0], b)
        else:
            rest.append((a, b))
    return mats, rest


class _Range:
    """Part [a, b) of a flat slice, as AdamW's update takes one: data, grad and the decayed ranges in it."""

    def __init__(self, s, a, b):
        self.data, self.grad = s.data[a:b], s.grad[a:b]
        self.decay_ranges = [(max(x, a) - a, min(y, b) - a) for x, y in s.decay_ranges if max(x, a) < min(y, b)]
