"""Optimizers, gradient clipping and the learning-rate schedule, on flat buffers.

An optimizer updates *flat slices* (flat.FlatSlice): flat views (data, grad) of the parameters this
rank is responsible for - whole buckets, or with ZeRO-1 its 1/dp range of each bucket - plus the ranges
inside them that get weight decay.  Elementwise updates do not care how the model was cut, so every layout applies
exactly the same arithmetic to every number.

AdamW (Loshchilov & Hutter), decoupled weight decay, bias-corrected moments, as in PyTorch:
    p <- p (1 - lr wd)                         (only matrices and embeddings)
    m <- b1 m + (1 - b1) g,     v <- b2 v + (1 - b2) g^2
    p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
SGD with momentum (PyTorch's convention):  u <- mu u + g;  p <- p (1 - lr wd) - lr u
Muon for the blocks' matrices, AdamW for the rest: optim/muon.py (its Newton-Schulz: newton_schulz.py).

Both steps run block by block for the cache (``blocks``); ``sgd_plain`` and ``adamw_plain`` are the
lines above on whole arrays, their plain twins: read them first.
"""
import math

from hpcpar.backend import array_module, is_device_array

BLOCK = 64 * 1024           # numbers per block of an update: 256 KB of float32, in L2 with its partners


def blocks(flat):
    """[a, b) ranges that cut a flat array into cache-sized blocks (ops/blocks.py: why blocking pays);
    on a GPU one range, the whole array (one kernel per pass is what is fast there)."""
    n = flat.size
    step = n if is_device_array(flat) else BLOCK
    return [(a, min(n, a + step)) for a in range(0, n, max(1, step))]


class _BlockScratch:
    """An optimizer's one scratch block per dtype, kept between steps (not state: never saved), and its
    state as checkpoints see it (checkpoint/pieces.py): per slice key, {name: array over the slice}."""

    def flat_state(self, key):
        return self.state.get(key)

    def load_flat_state(self, key, arrays):
        self.state[key] = arrays

    def clear_state(self):
        self.state.clear()

    @staticmethod
    def holds(p, name):
        """Every parameter has every state of SGD and AdamW (Muon: optim/muon.py)."""
        return True

    def _blocks(self, flat):
        """(blocks(flat), a scratch array of flat's dtype and device for the largest of them)."""
        ranges = blocks(flat)
        n = max((b - a for a, b in ranges), default=0)
        tmp = self._scratch.get(flat.dtype)
        if tmp is None or tmp.size < n or array_module(tmp) is not array_module(flat):
            tmp = self._scratch[flat.dtype] = array_module(flat).empty(n, flat.dtype)
        return ranges, tmp


class SGD(_BlockScratch):
    state_names = ("momentum_buffer",)

    def __init__(self, lr, momentum=0.0, weight_decay=0.0):
        self.momentum, self.weight_decay = momentum, weight_decay
        self.state, self.t = {}, 0          # state[slice key] = {"momentum_buffer": array like the slice}
        self._scratch = {}                  # dtype -> one block's lr * update (not state: never saved)

    def step(self, slices, lr):
        """Block by block (see blocks()): the passes over a bucket of megabytes - momentum, product,
        update - then cost about one trip to memory, and lr * u goes to a scratch block, not a fresh
        array of the bucket's size.  The same operations in the same order as the textbook lines."""
        self.t += 1
        for s in slices:
            _decay(s, lr * self.weight_decay)
            st = self.state.get(s.key)
            first = self.momentum and st is None
            if first:
                st = self.state[s.key] = {"momentum_buffer": s.grad.copy()}   # PyTorch: first buffer = g
            u = st["momentum_buffer"] if self.momentum else None
            ranges, tmp = self._blocks(s.data)
            for a, b in ranges:
                sgd_update(s.data[a:b], s.grad[a:b], None if u is None else u[a:b], tmp[:b - a], lr,
                           0.0 if first else self.momentum)


class AdamW(_BlockScratch):
    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        self.b1, self.b2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        self.state, self.t = {}, 0          # state[slice key] = {"exp_avg": m, "exp_avg_sq": v}
        self._scratch = {}                  # dtype -> one block of work (not state: never saved)

    def step(self, slices, lr):
        """Block by block, as SGD: adamw_update's ten passes run on one cache-sized block of p, g, m and
        v before the next, so memory sees each number about once instead of ten times.  Element-wise,
        so the same bits as adamw_update on the whole arrays."""
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t   # bias corrections
        for s in slices:
            xp = array_module(s.data)
            if s.key not in self.state:
                self.state[s.key] = {"exp_avg": xp.zeros_like(s.data), "exp_avg_sq": xp.zeros_like(s.data)}
            self.update(s, self.state[s.key]["exp_avg"], self.state[s.key]["exp_avg_sq"], lr, c1, c2)

    def update(self, s, m, v, lr, c1, c2):
        """The update of one flat slice s (data, grad, decay_ranges) with its moments m and v, the bias
        corrections c1, c2 of this step (Muon hands AdamW the numbers that are not its matrices here)."""
        _decay(s, lr * self.weight_decay)
        ranges, tmp = self._blocks(s.data)
        for a, b in ranges:
            adamw_update(s.data[a:b], s.grad[a:b], m[a:b], v[a:b], tmp[:b - a],
                         lr, self.b1, self.b2, self.eps, c1, c2)


def adamw_update(p, g, m, v, tmp, lr, b1, b2, eps, c1, c2):
    """One AdamW update of p, m and v in place (weight decay aside), tmp a scratch array of their size:
    every operation in place, so ten passes and no temporary.  AdamW.step calls it block by block; on
    whole arrays it is the plain update the blocks are measured against (bench fast-ops)."""
    xp = array_module(p)
    m *= b1
    xp.multiply(g, 1 - b1, out=tmp)
    m += tmp                                                    # m = b1 m + (1 - b1) g
    v *= b2
    xp.multiply(g, g, out=tmp)
    tmp *= 1 - b2
    v += tmp                                                    # v = b2 v + (1 - b2) g^2
    xp.sqrt(v, out=tmp)
    tmp *= 1 / math.sqrt(c2)
    tmp += eps                                                  # sqrt(v / c2) + eps, as PyTorch
    xp.divide(m, tmp, out=tmp)
    tmp *= lr / c1
    p -= tmp                                                    # p = p - lr (m / c1) / (...)


def sgd_update(p, g, u, tmp, lr, momentum):
    """One SGD update of p and its momentum buffer u (None: none) in place, weight decay aside, tmp a
    scratch array of their size: u = mu u + g (mu = 0: u as it is), p = p - lr u.  SGD.step calls it
    block by block."""
    if u is None:
        u = g
    elif momentum:
        u *= momentum
        u += g
    array_module(u).multiply(u, lr, out=tmp)
    p -= tmp


# The plain twins of the two steps: the textbook lines of the module's docstring on whole arrays, weight
# decay included (tests/test_fast_ops.py holds SGD.step and AdamW.step to them, float64 to 1e-12).

def sgd_plain(p, g, u, lr, momentum, decay):
    """p and u after one SGD step from gradient g; u the momentum buffer before it (None on the first step
    or without momentum: PyTorch starts it at g); ``decay`` = (mask of the decayed numbers, lr wd).
    -> (p, u)"""
    mask, factor = decay
    u = g if u is None or not momentum else momentum * u + g
    return p * (1.0 - factor * mask) - lr * u, (u if momentum else None)


def adamw_plain(p, g, m, v, lr, b1, b2, eps, t, decay):
    """p, m, v after AdamW's step t from gradient g, ``decay`` as sgd_plain's.  -> (p, m, v)"""
    mask, factor = decay
    p = p * (1.0 - factor * mask)
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    return p - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)) ** 0.5 + eps), m, v


def _decay(flat, factor):
    if factor:
        for a, b in flat.decay_ranges:
            flat.data[a:b] *= 1.0 - factor


def state_arrays(name, momentum=0.0, matrix=False):
    """How many arrays the size of its parameters an optimizer keeps (the memory formulas count these;
    the scratch block is not one): Muon one for a matrix it orthogonalises (its momentum), AdamW's two
    for the rest."""
    if name == "muon" and matrix:
        return 1
    return len(AdamW.state_names) if name in ("adamw", "muon") else (len(SGD.state_names) if momentum else 0)


def make_optimizer(name, lr, momentum=0.0, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, **muon):
    """``muon``: Muon's own settings (ns, scale_kind, nesterov, orthogonalise: optim/muon.py)."""
    if name == "sgd":
        return SGD(lr, momentum, weight_decay)
    if name == "adamw":
        return AdamW(lr, (beta1, beta2), eps, weight_decay)
    if name == "muon":
        from hpcpar.optim.muon import Muon
        return Muon(AdamW(lr, (beta1, beta2), eps, weight_decay), momentum, **muon)
    from hpcpar.runtime import UsageError
    raise UsageError(f"unknown optimizer {name!r}: choose sgd, adamw or muon")


def clip_coefficient(norm, max_norm):
    """Scale that brings the global gradient norm down to max_norm (1.0 if already below; 0 disables)."""
    if max_norm <= 0 or norm <= max_norm:
        return 1.0
    return max_norm / (norm + 1e-6)


def learning_rate(step, lr, min_lr, warmup, total):
    """Linear warm-up from lr/warmup to lr over `warmup` steps, then cosine decay to min_lr at `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if total <= warmup:
        return lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))
