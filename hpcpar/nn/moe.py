"""A mixture-of-experts feed-forward block, in place of the dense MLP (GPT-2 and Llama families).

    x (B, T, C) -> rows x (N, C), N = B T
    l = x W_gate                                  router logits (N, E)
    idx, w = route(l)                             top-k experts and combine weights (N, k) (ops/router.py)
    xs = x[order // k]                            each expert's rows contiguous (M, C)   (ops/moe.py)
    ys = expert_e(xs[rows of e])                  grouped GEMMs (nn/experts.py)          (M, C)
    y  = sum_j w[t, j] ys[row of (t, j)]          + shared(x), the shared experts' dense MLP  (N, C)
    -> dropout -> (B, T, C)

Backward runs the same lines in reverse; the router's gradient comes from the combine weights
(dw = dy . ys) and, with ``aux_loss_coef`` > 0, from the load-balancing loss.  That loss is this
layer's own: its gradient enters here, scaled by ``ctx.loss_scale`` (the gradient of the step's loss
with respect to this micro-batch's loss sum), as the micro-batch's contribution

    aux_sum = coef N E sum_e f_e P_e        (per-token sum; at one micro-batch, the step's loss gains
                                             coef E sum_e f_e P_e, the Switch/Mixtral form, per layer)

Dropless (``capacity_factor`` 0) every choice is computed.  Otherwise each expert takes at most
ceil(capacity_factor N k / E) rows; the dropped choices contribute nothing and are counted.

DeepSeek-V3's auxiliary-loss-free balancing (``bias_rate`` > 0): a bias on the scores moves the top-k
choice only; it is a parameter whose gradient stays zero (nothing in the backward adds to it, so the
optimizer leaves it alone), moved once a step by ``update_bias`` towards an even load - on every rank
alike, whole (ZeRO-3 keeps it so: hpcpar/data_parallel/fsdp.py).

Under expert parallelism (``parallel``, hpcpar/expert_parallel/dispatch.py) the experts run on other ranks: the
rows go there and back by all-to-all, between the dispatch and the combine, which stay here.

Each backward adds its micro-batch's expert counts, dropped choices and aux_sum to ``stats``, which
the training loop reads and clears once a step (backward, not forward: recomputation runs the
forward twice, and evaluation runs no backward).
"""
import math

import numpy as np

from hpcpar.backend import array_module, to_numpy
from hpcpar.nn.dropout import Dropout
from hpcpar.nn.linear import Linear
from hpcpar.nn.module import Module
from hpcpar.nn.parameter import Parameter, init_full
from hpcpar.ops.moe import (combine_backward, combine_forward, dispatch_backward, dispatch_forward,
                            route_order, slots)
from hpcpar.ops.router import (balance_bias_update, expert_counts, load_balance_backward, load_balance_forward,
                               router_backward, router_forward)
from hpcpar.precision import to_fp32
from hpcpar.runtime import UsageError

# hpcpar train's flags -> GPTConfig's fields (0 or the default: the preset's)
_FLAGS = {"experts": "n_expert", "top_k": "top_k", "shared_experts": "n_shared_expert", "router_score": "router_score",
          "aux_loss_coef": "aux_loss_coef", "capacity_factor": "capacity_factor", "bias_rate": "bias_rate"}


def moe_options(cfg):
    """The GPTConfig overrides the run's MoE flags give."""
    return {field: getattr(cfg, flag) or None for flag, field in _FLAGS.items()}


def check_moe(mcfg, cfg):
    """Refuse, in one line, what the mixture of experts cannot do with this run (before any communication)."""
    if not mcfg.n_expert:
        given = [f for f in _FLAGS if f != "experts" and getattr(cfg, f) not in (0, "softmax")]
        given += ["ep"] if cfg.ep > 1 else []
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} needs experts: give --experts N or --model moe-tiny "
                             f"or mixtral-tiny")
        return
    if mcfg.top_k > mcfg.n_expert:
        raise UsageError(f"--top-k {mcfg.top_k} is more than the {mcfg.n_expert} experts")
    if mcfg.n_expert % cfg.ep:
        raise UsageError(f"--ep {cfg.ep} must divide the {mcfg.n_expert} experts (each rank runs E / ep of them)")
    if (cfg.dp * cfg.cp) % cfg.ep:
        raise UsageError(f"--ep {cfg.ep} must divide dp x cp = {cfg.dp} x {cfg.cp} = {cfg.dp * cfg.cp}: the "
                         f"expert-parallel ranks are taken from the data- and context-parallel ones")
    if (cfg.cp > 1 or cfg.sequence_parallel) and (mcfg.aux_loss_coef or mcfg.capacity_factor):
        raise UsageError("--aux-loss-coef and --capacity-factor count a micro-batch's tokens, which --cp and "
                         "--sequence-parallel split over ranks: use them without")


def check_groups(cfg):
    """Refuse group-limited routing that cannot cut the experts (a GPTConfig's check)."""
    if cfg.n_expert and (cfg.n_expert % cfg.n_group or cfg.n_expert // cfg.n_group < 2
                         or not 1 <= cfg.topk_group <= cfg.n_group):
        raise UsageError(f"group-limited routing: {cfg.n_group} groups of the {cfg.n_expert} experts, two or "
                         f"more each, and topk_group {cfg.topk_group} of them at most")


def capacity(capacity_factor, n_token, k, n_expert):
    """Rows an expert may take: ceil(capacity_factor N k / E); None when dropless (capacity_factor 0)."""
    return math.ceil(capacity_factor * n_token * k / n_expert) if capacity_factor else None


class MoE(Module):
    def __init__(self, prefix, cfg, seed, dtype, std=0.02):
        C, E = cfg.d_model, cfg.n_expert
        self.n_expert, self.k = E, cfg.top_k
        self.score, self.normalise = cfg.router_score, cfg.norm_topk
        self.groups, self.scale = (cfg.n_group, cfg.topk_group), cfg.routed_scale      # DeepSeek-V3's (ops/router.py)
        self.aux_coef, self.capacity_factor, self.bias_rate = cfg.aux_loss_coef, cfg.capacity_factor, cfg.bias_rate
        self.gate = Linear(f"{prefix}.gate", C, E, std, seed, dtype, bias=False)
        self.gate.weight.router = True          # AdamW's, not Muon's (optim/muon.py)
        self.bias = None
        if cfg.routing_bias:
            name = f"{prefix}.gate.e_score_correction_bias"              # DeepSeek-V3's name
            self.bias = Parameter(name, init_full(name, (E,), "zeros", seed, dtype), decay=False)
        self.experts = cfg.parts.experts(f"{prefix}.experts", E, C, cfg.d_ff, cfg.n_layer, seed, dtype)
        self.shared = None
        if cfg.n_shared_expert:                  # one dense MLP as wide as the shared experts together
            self.shared = self.experts.shared(f"{prefix}.shared_experts", cfg, cfg.n_shared_expert * cfg.d_ff,
                                              seed, dtype)
        self.drop = Dropout(f"{prefix}.dropout", cfg.dropout)
        self.stats = MoEStats(E)
        self.parallel = None            # expert parallelism: expert_parallel/dispatch.py's dispatch over ranks

    def forward(self, x, ctx=None):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])                                   # (N, C)
        N = x2.shape[0]
        logits, c_gate = self.gate.forward(x2, ctx)                     # (N, E)
        idx, w, c_route = router_forward(to_fp32(logits), self.k, self.score,
                                         None if self.bias is None else self.bias.data, self.normalise,
                                         self.groups, self.scale)
        order, offsets, dropped = route_order(idx, self.n_expert, capacity(self.capacity_factor, N, self.k,
                                                                           self.n_expert))
        slot = slots(order, N, self.k)                                  # (N, k)
        xs = dispatch_forward(x2, order, self.k)                        # (M, C)
        ys, c_exp = self.experts.forward(xs, offsets, ctx) if self.parallel is None else \
            self.parallel.forward(self.experts, xs, offsets, ctx)      # (M, C)
        y = combine_forward(ys, w, slot)                                # (N, C)
        c_shared = None
        if self.shared is not None:
            s, c_shared = self.shared.forward(x2, ctx)
            y += s
        y, mask = self.drop.forward_tokens(y.reshape(shape), ctx)
        scale = ctx.loss_scale if ctx is not None else 0.0
        return y, (shape, logits.dtype, c_gate, c_route, order, slot, w, ys, c_exp, c_shared, mask, dropped, scale)

    def backward(self, dy, cache, defer=None):
        shape, dtype, c_gate, c_route, order, slot, w, ys, c_exp, c_shared, mask, dropped, scale = cache
        dy2 = self.drop.backward(dy, mask).reshape(-1, shape[-1])      # (N, C)
        N = dy2.shape[0]
        dys, dw = combine_backward(dy2, ys, w, order)                   # (M, C), (N, k)
        dxs = self.experts.backward(dys, c_exp, defer) if self.parallel is None else \
            self.parallel.backward(self.experts, dys, c_exp, defer)
        dx = dispatch_backward(dxs, slot)
        counts = expert_counts(c_route[2], self.n_expert)
        aux, ds_aux = 0.0, None
        if self.aux_coef:
            aux, f = load_balance_forward(c_route, counts)
            ds_aux = load_balance_backward(scale * self.aux_coef * N, c_route, f)
        dlogits = router_backward(dw, c_route, ds_aux).astype(dtype, copy=False)
        dx += self.gate.backward(dlogits, c_gate, defer)
        if self.shared is not None:
            dx += self.shared.backward(dy2, c_shared, defer)
        self.stats.add(counts, dropped, self.aux_coef * N * aux)
        return dx.reshape(shape)

    def update_bias(self, counts):
        """After the optimizer step, with the step's expert counts summed over every replica."""
        if self.bias_rate:
            bias = self.bias.master_data()
            balance_bias_update(bias, array_module(bias).asarray(counts), self.bias_rate)
            if self.bias.master is not None:                            # its low-precision copy
                self.bias.data[...] = bias


class MoEStats:
    """One layer's routing in the current step: choices per expert, choices dropped, aux_sum."""

    def __init__(self, n_expert):
        self.counts = np.zeros(n_expert, np.int64)
        self.dropped = 0
        self.aux_sum = 0.0

    def add(self, counts, dropped, aux_sum):
        self.counts += to_numpy(counts)
        self.dropped += int(to_numpy(dropped).sum())
        self.aux_sum += aux_sum

    def clear(self):
        self.__init__(len(self.counts))
