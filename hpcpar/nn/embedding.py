"""GPT input: token embedding plus learned position embedding, then dropout.

    x[b, t] = wte[ids[b, t]] + wpe[pos[t]]     ids (B, T) -> x (B, T, C)

pos[t] is token t's global position: t itself, unless the rank holds other parts of the sequence
(context parallelism: ctx.positions); with documents (ctx.docs) its place in its own document, pos
(B, T) restarting at 0 at each document's start (ops/masks.py), so rows of wpe repeat and their
gradients are scatter-added.

An architecture with rotary positions (Llama) has no position table (``wpe`` is None): x = wte[ids].

The token lookup is the one part tensor parallelism changes (each rank holds a slice of the
vocabulary: tensor_parallel/layers.py overrides ``tokens_forward``, ``positions`` and
``tokens_weight_grad``); the position embedding and dropout are written here once for both.
"""
from hpcpar.backend import array_module, scatter_add
from hpcpar.nn.dropout import Dropout
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.nn.parameter import Parameter, init_full
from hpcpar.ops.embedding import embedding_backward_weight, embedding_forward
from hpcpar.ops.masks import token_positions


class Embedding(Module):
    def __init__(self, cfg, seed, dtype):
        V, T, C = cfg.vocab_size, cfg.n_positions, cfg.d_model
        name = cfg.parts.tokens
        self.wte = Parameter(name, init_full(name, (V, C), 0.02, seed, dtype))
        self.wpe = Parameter("wpe.weight", init_full("wpe.weight", (T, C), 0.02, seed, dtype)) \
            if cfg.parts.position_table else None
        self.drop = Dropout("drop", cfg.dropout)

    @classmethod
    def lookup(cls, wte):
        """The token lookup on ``wte`` alone - no positions, no dropout: the MTP modules' (nn/mtp.py)."""
        embed = cls.__new__(cls)
        embed.wte, embed.wpe, embed.drop = wte, None, Dropout("drop", 0.0)
        return embed

    def forward(self, ids, ctx=None):
        tokens, c_tok = self.tokens_forward(ids, ctx)                   # (B, T, C)
        positions = self.positions(ids, ctx)
        x = tokens if self.wpe is None else tokens + self.wpe.data[positions]     # (B, T, C)
        x, mask = self.drop.forward_tokens(x, ctx)
        return x, (c_tok, positions, mask)

    def forward_cached(self, ids, start):
        """Forward only, for generation: x (B, T, C) of the tokens ids (B, T) at positions
        [start, start + T) (a rotary model adds no position here: its attention rotates q and k)."""
        x = self.tokens_forward(ids, None)[0]                            # (B, T, C)
        return x if self.wpe is None else x + self.wpe.data[start:start + ids.shape[1]]

    def backward(self, dx, cache, defer=None):
        c_tok, positions, mask = cache
        dx = self.drop.backward(dx, mask)

        def weight_grad():
            if self.wpe is not None and getattr(positions, "ndim", 1) == 2:      # documents: rows repeat
                scatter_add(self.wpe.grad, positions.reshape(-1), dx.reshape(-1, dx.shape[-1]))
            elif self.wpe is not None:
                self.wpe.grad[positions] += dx.sum(axis=0)
            self.tokens_weight_grad(dx, c_tok)
        run_or_defer(weight_grad, defer)
        return None                                  # token ids have no gradient

    # --- the token lookup ----------------------------------------------------------------------

    def tokens_forward(self, ids, ctx):
        """wte[ids] (B, T, C), and what its weight gradient needs."""
        return embedding_forward(ids, self.wte.data), ids

    def positions(self, ids, ctx):
        """The rows of wpe this rank adds: the global positions of its T tokens (a slice 0 .. T-1, or
        ctx.positions as an index array on the parameters' device), or with documents their places in
        them (B, T)."""
        if ctx is None or (ctx.positions is None and ctx.docs is None):
            return slice(0, ids.shape[1])
        return array_module(self.wte.data).asarray(token_positions(ctx.docs, ctx.positions, ids.shape[1]))

    def tokens_weight_grad(self, dx, ids):
        self.wte.grad += embedding_backward_weight(dx, ids, self.wte.data.shape[0])


def embedding_copy(cfg, seed, dtype):
    """The last pipeline stage's copy of the token embedding (a tied head's, the MTP modules' lookup): drawn
    like the first stage's, its gradient summed with it every step (training/gradient_sums.py), not counted in the norm,
    not saved twice."""
    name = cfg.parts.tokens
    weight = Parameter(name, init_full(name, (cfg.vocab_size, cfg.d_model), 0.02, seed, dtype))
    weight.counted, weight.tied_copy = False, True
    return weight
