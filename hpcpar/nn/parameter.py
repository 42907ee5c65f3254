"""Parameters: a named tensor that knows where it came from.

Every parameter is generated *full* from the seed and its name (so tp = 1, 2, 4 and any pipeline split
start from the same model) and then, under tensor parallelism, cut to this rank's shard.  The
``Shard`` records the cut, so that gradient norms, checkpoints and resharding need no special cases.
"""
import zlib
from dataclasses import dataclass

import numpy as np

from hpcpar import backend


@dataclass(frozen=True)
class Shard:
    """This rank holds part ``index`` of ``parts`` along dimension ``dim`` of the full tensor.

    ``groups`` > 1 cuts each of ``groups`` equal blocks of the dimension separately and concatenates the
    pieces: GPT-2's fused c_attn weight is [Q | K | V] along its output dimension, and a rank must get
    its heads' columns of each of Q, K and V.  A dimension that does not divide by ``parts`` is padded
    with zeros at the end (the vocabulary of an embedding); ``assemble`` strips the padding again.
    """
    dim: int
    parts: int
    index: int
    groups: int = 1

    def padded_len(self, n):
        if self.groups > 1:
            if n % (self.groups * self.parts):
                raise ValueError(f"dimension {n} does not split into {self.groups} x {self.parts} parts")
            return n
        return -(-n // self.parts) * self.parts

    def local_shape(self, full_shape):
        shape = list(full_shape)
        shape[self.dim] = self.padded_len(full_shape[self.dim]) // self.parts
        return tuple(shape)

    def take(self, full):
        """This rank's shard (a new contiguous array) of the full tensor."""
        xp = backend.array_module(full)
        n = full.shape[self.dim]
        pad = self.padded_len(n) - n
        if pad:
            widths = [(0, 0)] * full.ndim
            widths[self.dim] = (0, pad)
            full = xp.pad(full, widths)
        blocks = xp.split(full, self.groups, axis=self.dim)
        return xp.ascontiguousarray(xp.concatenate(
            [xp.split(b, self.parts, axis=self.dim)[self.index] for b in blocks], axis=self.dim))

    def assemble(self, shards, full_shape):
        """The full tensor from the shards of every part (in part order): the inverse of ``take``."""
        xp = backend.array_module(shards[0])
        pieces = [xp.split(s, self.groups, axis=self.dim) for s in shards]   # [part][group]
        full = xp.concatenate([pieces[p][g] for g in range(self.groups) for p in range(self.parts)],
                              axis=self.dim)
        index = [slice(None)] * full.ndim
        index[self.dim] = slice(0, full_shape[self.dim])
        return full[tuple(index)]


class Parameter:
    """A weight on this rank: its (local) values and gradient, and how they relate to the full tensor.

    name         GPT-2 (Hugging Face) name, e.g. "h.0.attn.c_attn.weight"
    data, grad   local arrays of the same shape (grad accumulates over micro-batches)
    full_shape   shape of the whole tensor
    shard        Shard, or None when every TP rank holds the whole tensor (replicated)
    decay        AdamW weight decay applies (matrices and embeddings; not biases or LayerNorm)
    counted      counts towards the global gradient norm on this rank (a TP-replicated parameter counts
                 on tp rank 0 only; the last stage's copy of a tied embedding does not count)
    tp_partial   its gradient is a partial sum over the TP group that must be all-reduced (sequence
                 parallelism: LayerNorm and row-parallel bias see only this rank's tokens; QK-norm's
                 gains see only this rank's heads)
    tied_copy    the last pipeline stage's copy of the tied token embedding: kept equal to the first
                 stage's by summing their gradients, and neither counted in norms nor saved twice
    expert       an expert's weights under expert parallelism: ``shard`` is this rank's experts (cut over
                 the ep group, hpcpar/expert_parallel/), and the copies of that shard sit on the (dp x cp) / ep
                 ranks of its expert-data-parallel group, over which its gradient is summed
    master       under mixed precision the fp32 values the optimizer updates (``data`` is then their
                 low-precision compute copy, hpcpar/data_parallel/flat.py); None otherwise
    matrix       Muon orthogonalises it (hpcpar/optim/muon.py): a block's weight of two or more dimensions,
                 not a router (``router``); set by the stage (nn/stage.py ``mark_matrices``)
    fused        how many matrices lie side by side along its output dimension, orthogonalised apart
                 (GPT-2's c_attn [Q | K | V]: 3; an expert's [gate | up]: 2)
    """

    def __init__(self, name, data, decay=None):
        self.name = name
        self.data = data
        self.grad = backend.array_module(data).zeros_like(data)
        self.full_shape = tuple(data.shape)
        self.shard = None
        self.decay = data.ndim >= 2 if decay is None else decay
        self.counted = True
        self.tp_partial = False
        self.tied_copy = False
        self.expert = False
        self.master = None
        self.matrix = False
        self.router = False
        self.fused = 1

    def master_data(self):
        """The values that are saved, loaded and updated: the master copy if there is one, else data."""
        return self.data if self.master is None else self.master

    def shard_(self, shard):
        """Keep only this rank's shard of the (full) data."""
        self.data = shard.take(self.data)
        self.grad = backend.array_module(self.data).zeros_like(self.data)
        self.shard = shard
        return self

    def __repr__(self):
        cut = f", shard {self.shard}" if self.shard else ""
        return f"Parameter({self.name}, local {tuple(self.data.shape)} of {self.full_shape}{cut})"


def init_full(name, shape, std, seed, dtype):
    """The full initial tensor of parameter ``name``: normal(0, std), drawn from (seed, name) only.

    std == "zeros" / "ones" gives constants (biases, LayerNorm).  Drawn in float64 on the host and
    cast, so float32 and float64 runs start from the same numbers up to rounding.
    """
    xp = backend.xp()
    if std == "zeros":
        return xp.zeros(shape, dtype=dtype)
    if std == "ones":
        return xp.ones(shape, dtype=dtype)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return xp.asarray(rng.normal(0.0, std, size=shape).astype(dtype))
