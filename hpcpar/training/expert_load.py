"""Once a step, the routing of every mixture-of-experts layer: the load per expert, over the whole job.

Each MoE layer adds up its micro-batches' expert counts in its backward (nn/moe.py ``MoEStats``).
After the optimizer step ``ExpertLoad.step`` sums them over the world in one all-reduce of
(L E + 2) numbers - the data-parallel and context-parallel replicas see different tokens, the pipeline
stages hold different layers (each at its own row), tensor-parallel ranks contribute once (tp rank 0; with
sequence parallelism every one, each routing its own slice of the tokens).
Every rank then has the whole model's counts: it moves the DeepSeek-V3 routing bias of its own layers
(the same numbers everywhere, so replicas stay equal) and rank 0 reports

    load_min, load_max     the fewest and most choices one expert took, over layers and experts
    load_mean              an even share: N k / E choices per expert
    effective_experts      exp(entropy) of the load of the least balanced layer: E when even, k at worst
    dropped                choices over capacity (capacity-factor mode), summed over layers
    aux_loss               the load-balancing losses of the step (coefficient included, per-token mean)

and warns once when a layer's load collapses: fewer than (E + k) / 2 effective experts.
"""
import math

import numpy as np

from hpcpar.nn.moe import MoE


def moe_layers(chunks):
    """{global layer index: MoE} of the blocks this rank holds (an MTP module's block: n_layer + k - 1)."""
    return {b.layer: b.mlp for c in chunks for b in c.transformer_blocks() if isinstance(b.mlp, MoE)}


def effective_experts(counts):
    """exp of the entropy of a load (E,): the number of equally loaded experts it is worth."""
    p = counts / max(counts.sum(), 1)
    p = p[p > 0]
    return float(math.exp(-(p * np.log(p)).sum())) if p.size else 0.0


class ExpertLoad:
    def __init__(self, mcfg, chunks, grid, loss_terms, sequence_parallel=False):
        self.layers = moe_layers(chunks)
        # TP ranks route the same tokens (count them once), or with sequence parallelism each its own slice
        self.counts_here = grid.tp_rank == 0 or sequence_parallel
        # every block of the model, the MTP modules' after the rest; the figures are the MoE layers'
        self.n_layer, self.n_expert, self.k = mcfg.n_layer + mcfg.mtp_depth, mcfg.n_expert, mcfg.top_k
        self.moe = [i for i in range(self.n_layer) if mcfg.moe_layer(i)]
        self.grid, self.loss_terms = grid, loss_terms
        self.warned = False

    def step(self):
        """Collective over the world when the model has experts: update the routing biases and return
        this step's figures (a dict), or None for a dense model."""
        if not self.moe:                        # no experts, or every layer dense (--dims first_dense)
            return None
        L, E = self.n_layer, self.n_expert
        mine = np.zeros(L * E + 2)
        if self.counts_here:
            for i, moe in self.layers.items():
                mine[i * E:(i + 1) * E] = moe.stats.counts
                mine[L * E] += moe.stats.dropped
                mine[L * E + 1] += moe.stats.aux_sum
        total = self.grid.world_comm.all_reduce(mine)
        counts = total[:L * E].reshape(L, E)
        for i, moe in self.layers.items():
            moe.update_bias(counts[i])
            moe.stats.clear()
        worst = min(self.moe, key=lambda i: effective_experts(counts[i]))
        least = effective_experts(counts[worst])
        counts = counts[self.moe]                                  # the dense first layers route nothing
        figures = {"load_min": int(counts.min()), "load_max": int(counts.max()),
                   "load_mean": float(counts.sum(axis=1).mean() / E), "dropped": int(total[L * E]),
                   "effective_experts": least,
                   "aux_loss": float(total[L * E + 1]) / self.loss_terms}
        figures["collapsed_layer"] = worst if figures["effective_experts"] < (E + self.k) / 2 else None
        return figures

    def warning(self, figures, step):
        """The one-line warning of the first step whose load collapsed, else None."""
        if self.warned or figures is None or figures["collapsed_layer"] is None:
            return None
        self.warned = True
        return (f"hpcpar: warning: at step {step + 1} the experts' load collapsed in layer "
                f"{figures['collapsed_layer']}: {figures['effective_experts']:.2f} effective experts of "
                f"{self.n_expert} (busiest {figures['load_max']} choices, an even share {figures['load_mean']:.0f});"
                f" consider --aux-loss-coef or --bias-rate")
