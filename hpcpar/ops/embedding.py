"""Table lookup: row ids[i] of the table is the vector of token i.

    forward   y[b, t] = W[ids[b, t]]                   ids (B, T) ints, W (V, C), y (B, T, C)
    backward  dW[v] = sum of dy[b, t] over all (b, t) with ids[b, t] == v     (a scatter-add)

Repeated ids must accumulate, which rules out ``dW[ids] += dy`` (it keeps only one of the repeats).
"""
from hpcpar.backend import array_module, scatter_add
from hpcpar.precision import accumulator


def embedding_forward(ids, w):
    return w[ids]                                              # (B, T, C)


def embedding_backward_weight(dy, ids, vocab_size):
    """dW (vocab_size, C) for y = W[ids]."""
    xp = array_module(dy)
    C = dy.shape[-1]
    dw = xp.zeros((vocab_size, C), dtype=accumulator(dy.dtype))      # low precision: summed in fp32
    return scatter_add(dw, ids.reshape(-1), dy.reshape(-1, C))
