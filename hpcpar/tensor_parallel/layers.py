"""Tensor-parallel layers, each made from a serial layer whose full parameters it slices.

ColumnParallelLinear  Y = X [W_1 | ... | W_tp]: rank i computes X W_i, its own columns of Y.
                      Input region: f (or the sequence all-gather).  No communication in forward.
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
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.nn.parameter import Shard
from hpcpar.ops.linear import linear_backward_input, linear_backward_weight, linear_forward
from hpcpar.precision import to_fp32
from hpcpar.tensor_parallel.cross_entropy import (vocab_parallel_cross_entropy_backward,
                                                  vocab_parallel_cross_entropy_forward)
from hpcpar.tensor_parallel.regions import input_region, output_region


def replicate(params, comm, sequence_parallel):
    for p in params:
        p.counted = comm.rank == 0
        p.tp_partial = sequence_parallel


class ColumnParallelLinear(Module):
    def __init__(self, linear, comm, sequence_parallel=False, groups=1):
        self.comm, self.region, self.sp = comm, input_region(sequence_parallel), sequence_parallel
        self.weight = linear.weight.shard_(Shard(1, comm.size, comm.rank, groups))     # (in, out/tp)
        self.bias = linear.bias.shard_(Shard(0, comm.size, comm.rank, groups))         # (out/tp,)

    def forward(self, x, ctx=None):
        full = self.region.forward(self.comm, x)                  # (B, T, in): replicated input
        y = linear_forward(full, self.weight.data, self.bias.data)    # (B, T, out/tp)
        # Sequence parallelism keeps only this rank's slice of the input and gathers it again in the
        # backward (Korthikanti et al.): one more all-gather, tp times less activation memory here.
        return y, (x if self.sp else full)

    def backward(self, dy, cached, defer=None):
        full = self.region.forward(self.comm, cached) if self.sp else cached

        def weight_grad():
            dw, db = linear_backward_weight(dy, full)
            self.weight.grad += dw
            self.bias.grad += db
        run_or_defer(weight_grad, defer)
        return self.region.backward(self.comm, linear_backward_input(dy, self.weight.data))


class RowParallelLinear(Module):
    def __init__(self, linear, comm, sequence_parallel=False):
        self.comm, self.region = comm, output_region(sequence_parallel)
        self.weight = linear.weight.shard_(Shard(0, comm.size, comm.rank))             # (in/tp, out)
        self.bias = linear.bias
        replicate([self.bias], comm, sequence_parallel)

    def forward(self, x, ctx=None):
        y = self.region.forward(self.comm, linear_forward(x, self.weight.data))   # sum of partial products
        y += self.bias.data                                       # once, after the sum
        return y, x

    def backward(self, dy, x, defer=None):
        dy_local = self.region.backward(self.comm, dy)            # identity, or the sequence all-gather

        def weight_grad():
            self.weight.grad += linear_backward_weight(dy_local, x)[0]
            self.bias.grad += dy.reshape(-1, dy.shape[-1]).sum(axis=0)
        run_or_defer(weight_grad, defer)
        return linear_backward_input(dy_local, self.weight.data)   # (B, T, in/tp): stays parallel


class VocabParallelEmbedding(Module):
    def __init__(self, embed, comm, sequence_parallel=False):
        self.comm, self.sp = comm, sequence_parallel
        self.region = output_region(sequence_parallel)
        self.vocab_size = embed.wte.full_shape[0]
        self.wte = embed.wte.shard_(Shard(0, comm.size, comm.rank))                    # (V/tp, C)
        self.lo = comm.rank * self.wte.data.shape[0]
        self.wpe, self.drop = embed.wpe, embed.drop
        replicate([self.wpe], comm, sequence_parallel)

    def forward(self, ids, ctx=None):
        xp = array_module(self.wte.data)
        local = ids - self.lo
        mine = (local >= 0) & (local < self.wte.data.shape[0])
        local = xp.where(mine, local, 0)
        x = self.wte.data[local] * mine[..., None]                # (B, T, C), zero where not mine
        x = self.region.forward(self.comm, x)                     # (B, T or T/tp, C)
        positions = ctx.seq_slice if self.sp else slice(0, ids.shape[1])
        x = x + self.wpe.data[positions]
        x, mask = self.drop.forward_tokens(x, ctx)
        return x, (local, mine, positions, mask)

    def backward(self, dx, cache, defer=None):
        local, mine, positions, mask = cache
        dx = self.drop.backward(dx, mask)

        def weight_grad():
            self.wpe.grad[positions] += dx.sum(axis=0)
            full = self.region.backward(self.comm, dx) * mine[..., None]       # (B, T, C)
            C = full.shape[-1]
            scatter_add(self.wte.grad, local.reshape(-1), full.reshape(-1, C))
        run_or_defer(weight_grad, defer)
        return None


class VocabParallelLMHead(Module):
    def __init__(self, head, comm, sequence_parallel=False):
        self.comm, self.region = comm, input_region(sequence_parallel)
        self.ln_f = head.ln_f
        replicate(self.ln_f.parameters(), comm, sequence_parallel)
        self.weight = head.weight
        if self.weight.shard is None:                   # a tied weight may be cut by the embedding already
            self.weight.shard_(Shard(0, comm.size, comm.rank))                          # (V/tp, C)
        self.vocab_size = self.weight.full_shape[0]
        self.lo = comm.rank * self.weight.data.shape[0]

    def forward(self, x, targets, ctx=None):
        h, c_ln = self.ln_f.forward(x, ctx)                       # (B, T or T/tp, C)
        h = self.region.forward(self.comm, h)                     # (B, T, C) replicated
        h2 = h.reshape(-1, h.shape[-1])                           # (N, C)
        logits = linear_forward(h2, self.weight.data.T)           # (N, V/tp)
        losses, c_ce = vocab_parallel_cross_entropy_forward(to_fp32(logits), targets.reshape(-1), self.comm,
                                                            self.lo, self.vocab_size)
        return losses.sum(), (h.shape, h2, c_ln, c_ce)

    def backward(self, dloss, cache, defer=None):
        shape, h2, c_ln, c_ce = cache
        dlogits = vocab_parallel_cross_entropy_backward(dloss, c_ce).astype(h2.dtype, copy=False)  # (N, V/tp)

        def weight_grad():
            self.weight.grad += linear_backward_weight(dlogits, h2)[0].T
        run_or_defer(weight_grad, defer)
        dh = linear_backward_input(dlogits, self.weight.data.T).reshape(shape)   # (B, T, C) partial
        return self.ln_f.backward(self.region.backward(self.comm, dh), c_ln, defer)
