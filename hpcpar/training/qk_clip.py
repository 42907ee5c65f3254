"""QK-clip (Kimi K2's MuonClip, 2025): keep every attention head's largest logit at or below tau.

With Muon the attention logits of a few heads can grow without bound (Kimi's "MaxLogit explosion").
QK-clip caps them after each step, by the weights, without touching the forward or the backward:

    S_h      the step's largest pre-softmax logit q_i . k_j / sqrt(HS) of head h, over every sequence,
             token and visible (causal) pair - each attention core records its heads' maxima in its
             training forwards (nn/attention_core.recorder: the local core, ring attention's blocks,
             Ulysses' heads)
    gamma_h  = min(1, tau / S_h)
    W_q^h   <- gamma_h^alpha W_q^h,    W_k^h <- gamma_h^(1 - alpha) W_k^h      alpha = 0.5

q . k is bilinear and rotary positions rotate without scaling, so the head's logits scale by gamma_h:
on the same batch its largest would be tau.  Grouped-query attention shares a key between heads; there
the key stays and the query takes all of gamma_h (nn/rotary_attention.py ``qk_scales``), as Kimi's
report treats MLA's shared key.  GPT-2's q and k biases scale with their weights.

Across ranks: S is one (layers, heads) array, each rank filling its own layers (pipeline) and heads
(tensor parallelism: a rank's heads are its own) with -inf elsewhere, so one all-reduce (max) over the
world gives every rank every maximum - over dp (other sequences) and cp (other queries; Ulysses'
other heads) too.  The scaling is applied to the master values this rank updates - its owned range of
each flat buffer, before ZeRO shares them and the compute copies are rounded - so every layout scales
exactly the numbers one rank would.  The maxima of the last step: ``last``, in the metrics as "qk_max".
"""
import numpy as np

from hpcpar.backend import array_module, to_numpy


class QKClip:
    def __init__(self, tau, chunks, grid, n_layer, n_head, xp, alpha=0.5):
        self.tau, self.alpha, self.comm = tau, alpha, grid.world_comm
        self.attention = []                         # (layer, its first head on this rank, the module)
        for chunk in chunks:
            for block in chunk.blocks:
                nh = block.attn.heads_here()
                block.attn.core.logits = xp.full(nh, -np.inf)
                self.attention.append((block.layer, grid.tp_rank * nh, block.attn))
        self.shape = (n_layer, n_head)
        self.last = None                            # (n_layer, n_head) maxima of the last step

    def step(self, dp, slices, apply=True):
        """Collective over the world: the step's maxima (``last``); with ``apply``, the heads above tau
        scaled in this rank's owned ranges of ``dp``'s flat buffers (``slices``: their master values)."""
        mine = np.full(self.shape, -np.inf)
        for layer, first, attn in self.attention:
            logits = attn.core.logits
            mine[layer, first:first + logits.size] = to_numpy(logits)
            logits[...] = -np.inf
        self.last = self.comm.all_reduce(mine, op="max")
        if not apply:
            return
        scales = {}
        for layer, first, attn in self.attention:
            s = self.last[layer, first:first + attn.core.logits.size]
            if (s > self.tau).any():
                gamma = array_module(attn.core.logits).asarray(np.minimum(1.0, self.tau / s))
                scales.update((id(p), cols) for p, cols in attn.qk_scales(gamma, self.alpha))
        if scales:
            scale_owned(dp, slices, scales)


def scale_owned(dp, slices, scales):
    """Multiply the output columns of parameters by ``scales`` {id(p): (out,) multipliers} where this rank
    updates them: its owned range [lo, hi) of each flat buffer, whatever cut of p falls there."""
    for i, s in enumerate(slices):
        lo, hi = dp.owned_range(i)
        for p, a, b in dp.flats[i].segments:
            x, y = max(a, lo), min(b, hi)
            if id(p) in scales and x < y:
                mult = array_module(s.data).broadcast_to(scales[id(p)], p.data.shape).reshape(-1)
                s.data[x - lo:y - lo] *= mult[x - a:y - a]
