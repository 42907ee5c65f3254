"""Tensor-parallel layers, each made from a serial layer whose full parameters it slices.

ColumnParallelLinear  Y = X [W_1 | ... | W_tp]: rank i computes X W_i, its own columns of Y.
                      Input region: f (or the sequence all-gather).  No communication in forward.
ColumnParallelProjections  several of them on one input (Llama's q, k, v; gate, up), one region crossing.
RegionEntry / HeadParallelLinear  the region crossed once on its own (MLA: on x), then column cuts inside
                      it with no communication (MLA's up-projections, after latents every rank computes).
RowParallelLinear     Y = [X_1 ... X_tp] [W_1; ...; W_tp] = sum_i X_i W_i: rank i holds rows W_i and
                      the matching columns X_i (the column-parallel output), computes a partial sum,
                      and g (or the sequence reduce-scatter) adds them up.  Bias after the sum.
VocabParallelEmbedding  rank i holds rows [lo, hi) of the token table; tokens outside give zeros; g
                      sums the ranks' partial lookups.  The position embedding is added after the sum.
VocabParallelLMHead   final LayerNorm, f, logits for this rank's vocabulary slice, vocab-parallel loss.

Parameters that are not cut (LayerNorm, row-parallel bias, the position embedding) are *replicated*:
identical on every TP rank, counted once (tp rank 0) in the gradient norm, and - with sequence
parallelism, where each rank sees only its tokens - their gradients are partial sums (``tp_partial``).
"""
from hpcpar.backend import array_module, scatter_add
from hpcpar.nn.embedding import Embedding
from hpcpar.nn.head import LMHead
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.nn.parameter import Shard
from hpcpar.ops.linear import bias_backward, linear_backward_input, linear_backward_weight, linear_forward
from hpcpar.tensor_parallel.cross_entropy import (vocab_parallel_cross_entropy_backward,
                                                  vocab_parallel_cross_entropy_forward)
from hpcpar.tensor_parallel.regions import input_region, output_region


def replicate(params, comm, sequence_parallel):
    for p in params:
        p.counted = comm.rank == 0
        p.tp_partial = sequence_parallel


class ColumnParallelLinear(Module):
    mm = None               # its quantised GEMMs under an FP8/FP4 recipe (training/low_precision.py)

    def __init__(self, linear, comm, sequence_parallel=False, groups=1):
        self.comm, self.region, self.sp = comm, input_region(sequence_parallel), sequence_parallel
        self.weight = linear.weight.shard_(Shard(1, comm.size, comm.rank, groups))     # (in, out/tp)
        self.bias = linear.bias and linear.bias.shard_(Shard(0, comm.size, comm.rank, groups))   # (out/tp,)

    def forward(self, x, ctx=None, fp32=False):
        full = self.region.forward(self.comm, x)                  # (B, T, in): replicated input
        # Sequence parallelism keeps only this rank's slice of the input and gathers it again in the
        # backward (Korthikanti et al.): one more all-gather, tp times less activation memory here.
        return self.local_forward(full, fp32), (x if self.sp else full)

    def backward(self, dy, cached, defer=None):
        full = self.region.forward(self.comm, cached) if self.sp else cached
        return self.region.backward(self.comm, self.local_backward(dy, full, defer))

    # --- the local GEMMs, between the region crossings ------------------------------------------

    def local_forward(self, full, fp32=False):
        return linear_forward(full, self.weight.data, self.bias and self.bias.data, fp32, self.mm)    # (B, T, out/tp)

    def local_backward(self, dy, full, defer):
        """This rank's term of dL/dx (B, T, in), before the group sums it; the weight gradient."""
        def weight_grad():
            linear_backward_weight(dy, full, bias=self.bias is not None,
                                   into=(self.weight.grad, self.bias.grad if self.bias else None), mm=self.mm)
        run_or_defer(weight_grad, defer)
        return linear_backward_input(dy, self.weight.data, mm=self.mm)


class ColumnParallelProjections(Module):
    """Several column-parallel projections of one input (nn/linear.py Projections): the input region
    is crossed once for all of them - one f (or sequence all-gather) forward, one all-reduce (or
    reduce-scatter) of the summed input gradient backward - instead of once per projection."""

    def __init__(self, projections, comm, sequence_parallel=False):
        self.comm, self.region, self.sp = comm, input_region(sequence_parallel), sequence_parallel
        self.parts = [ColumnParallelLinear(p, comm, sequence_parallel) for p in projections.parts]

    def forward(self, x, ctx=None):
        full = self.region.forward(self.comm, x)                  # (B, T, in), once
        return [p.local_forward(full) for p in self.parts], (x if self.sp else full)

    def backward(self, dys, cached, defer=None):
        full = self.region.forward(self.comm, cached) if self.sp else cached
        dx = self.parts[0].local_backward(dys[0], full, defer)
        for part, dy in zip(self.parts[1:], dys[1:]):
            dx += part.local_backward(dy, full, defer)
        return self.region.backward(self.comm, dx)                # the sum of every projection's term, once


class RegionEntry(Module):
    """The input region on its own: f (or the sequence all-gather) forward, the all-reduce (or
    reduce-scatter) of the summed input gradient backward.  MLA enters it once, on x (nn/mla.py)."""

    def __init__(self, comm, sequence_parallel=False):
        self.comm, self.region = comm, input_region(sequence_parallel)

    def forward(self, x):
        return self.region.forward(self.comm, x)

    def backward(self, dx):
        return self.region.backward(self.comm, dx)


class HeadParallelLinear(ColumnParallelLinear):
    """A column cut inside a region already entered: no communication either way; its input gradient is
    this rank's heads' share, summed where the region was entered (``RegionEntry``)."""

    def forward(self, x, ctx=None):
        return self.local_forward(x), x

    def backward(self, dy, x, defer=None):
        return self.local_backward(dy, x, defer)


class RowParallelLinear(Module):
    mm = None

    def __init__(self, linear, comm, sequence_parallel=False):
        self.comm, self.region = comm, output_region(sequence_parallel)
        self.weight = linear.weight.shard_(Shard(0, comm.size, comm.rank))             # (in/tp, out)
        self.bias = linear.bias                                   # (out,) or None
        replicate([self.bias] if self.bias else [], comm, sequence_parallel)

    def forward(self, x, ctx=None):
        y = self.region.forward(self.comm, linear_forward(x, self.weight.data, mm=self.mm))   # sum of partials
        if self.bias is not None:
            y += self.bias.data                                   # once, after the sum
        return y, x

    def backward(self, dy, x, defer=None, fp32=False):
        dy_local = self.region.backward(self.comm, dy)            # identity, or the sequence all-gather

        def weight_grad():
            linear_backward_weight(dy_local, x, bias=False, into=(self.weight.grad, None), mm=self.mm)    # bias: below
            if self.bias is not None:
                bias_backward(dy, into=self.bias.grad)
        run_or_defer(weight_grad, defer)
        return linear_backward_input(dy_local, self.weight.data, fp32, self.mm)   # (B, T, in/tp): stays parallel


class VocabParallelEmbedding(Embedding):
    """The serial embedding's forward and backward (position embedding, dropout); only the token
    lookup below is split over the vocabulary."""

    def __init__(self, embed, comm, sequence_parallel=False):
        self.comm, self.sp = comm, sequence_parallel
        self.region = output_region(sequence_parallel)
        self.vocab_size = embed.wte.full_shape[0]
        self.wte = embed.wte
        if self.wte.shard is None:                      # the MTP modules share the embedding's, cut already
            self.wte.shard_(Shard(0, comm.size, comm.rank))                             # (V/tp, C)
        self.lo = comm.rank * self.wte.data.shape[0]
        self.wpe, self.drop = embed.wpe, embed.drop               # wpe: None under rotary positions
        replicate([self.wpe] if self.wpe else [], comm, sequence_parallel)

    def tokens_forward(self, ids, ctx):
        xp = array_module(self.wte.data)
        local = ids - self.lo
        mine = (local >= 0) & (local < self.wte.data.shape[0])
        local = xp.where(mine, local, 0)
        x = self.wte.data[local] * mine[..., None]                # (B, T, C), zero where not mine
        return self.region.forward(self.comm, x), (local, mine)   # (B, T or T/tp, C): g sums the ranks

    def positions(self, ids, ctx):
        """Under sequence parallelism, the positions of this rank's slice of the tokens."""
        positions = super().positions(ids, ctx)
        if not self.sp:
            return positions
        return ctx.seq_slice if isinstance(positions, slice) else positions[..., ctx.seq_slice]

    def tokens_weight_grad(self, dx, cache):
        local, mine = cache
        full = self.region.backward(self.comm, dx) * mine[..., None]       # (B, T, C)
        C = full.shape[-1]
        scatter_add(self.wte.grad, local.reshape(-1), full.reshape(-1, C))


class VocabParallelLMHead(LMHead):
    """The serial head's forward and backward; h is gathered (f, or the sequence all-gather), dh summed
    back, and the loss taken over this rank's slice of the vocabulary."""

    def __init__(self, head, comm, sequence_parallel=False):
        self.comm, self.region = comm, input_region(sequence_parallel)
        self.ln_f, self.mtp = head.ln_f, head.mtp
        replicate(self.ln_f.parameters(), comm, sequence_parallel)
        self.weight = head.weight
        if self.weight.shard is None:                   # a tied weight may be cut by the embedding already
            self.weight.shard_(Shard(0, comm.size, comm.rank))                          # (V/tp, C)
        self.vocab_size = self.weight.full_shape[0]
        self.lo = comm.rank * self.weight.data.shape[0]

    def gather_hidden(self, h):
        return self.region.forward(self.comm, h)                  # (B, T or T/tp, C) -> (B, T, C) replicated

    def reduce_hidden_grad(self, dh):
        return self.region.backward(self.comm, dh)                # partial (B, T, C) -> summed

    def loss_forward(self, logits, targets):                      # logits (N, V/tp)
        return vocab_parallel_cross_entropy_forward(logits, targets, self.comm, self.lo, self.vocab_size)

    def loss_backward(self, dloss, c_ce):
        return vocab_parallel_cross_entropy_backward(dloss, c_ce)
