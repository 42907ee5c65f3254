"""GPT input: token embedding plus learned position embedding, then dropout.

    x[b, t] = wte[ids[b, t]] + wpe[t]          ids (B, T) -> x (B, T, C)
"""
from hpcpar.nn.dropout import Dropout
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.nn.parameter import Parameter, init_full
from hpcpar.ops.embedding import embedding_backward_weight, embedding_forward


class Embedding(Module):
    def __init__(self, cfg, seed, dtype):
        V, T, C = cfg.vocab_size, cfg.n_positions, cfg.d_model
        self.wte = Parameter("wte.weight", init_full("wte.weight", (V, C), 0.02, seed, dtype))
        self.wpe = Parameter("wpe.weight", init_full("wpe.weight", (T, C), 0.02, seed, dtype))
        self.drop = Dropout("drop", cfg.dropout)

    def forward(self, ids, ctx=None):
        T = ids.shape[1]
        x = embedding_forward(ids, self.wte.data) + self.wpe.data[:T]   # (B, T, C)
        x, mask = self.drop.forward_tokens(x, ctx)
        return x, (ids, mask)

    def backward(self, dx, cache, defer=None):
        ids, mask = cache
        dx = self.drop.backward(dx, mask)

        def weight_grad():
            self.wte.grad += embedding_backward_weight(dx, ids, self.wte.data.shape[0])
            self.wpe.grad[:ids.shape[1]] += dx.sum(axis=0)
        run_or_defer(weight_grad, defer)
        return None                                  # token ids have no gradient
