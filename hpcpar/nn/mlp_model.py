"""A plain deep MLP, the simplest model to pipeline: an input projection, a stack of MLP blocks,
an output projection and a summed squared error.

    h_0 = x W_in + b_in                 x (B, D_in) -> (B, C)
    h_i = mlp_i(h_{i-1})                 i = 1..L, each Linear(C, F) -> GELU -> Linear(F, C)
    loss = 1/2 sum (h_L W_out + b_out - y)^2       y (B, D_out)

Like ``GPT``, an ``MLPModel`` is one pipeline stage (a run of blocks, plus input or output layer at the
ends), with the same forward/backward contract.
"""
from dataclasses import dataclass

from hpcpar.backend import resolve_dtype
from hpcpar.nn.linear import Linear
from hpcpar.nn.mlp import MLP
from hpcpar.nn.module import Module
from hpcpar.nn.stage import Stage
from hpcpar.precision import to_fp32


@dataclass(frozen=True)
class MLPConfig:
    d_in: int = 16
    d_model: int = 32
    d_ff: int = 64
    n_layer: int = 4
    d_out: int = 8


class SquaredErrorHead(Module):
    def __init__(self, cfg, seed, dtype):
        self.out = Linear("out", cfg.d_model, cfg.d_out, cfg.d_model ** -0.5, seed, dtype)

    def forward(self, x, targets, ctx=None):
        y, c = self.out.forward(x, ctx)                 # (B, D_out)
        err = to_fp32(y) - to_fp32(targets)             # the loss in fp32 (hpcpar/precision.py)
        return 0.5 * (err * err).sum(), (c, err, y.dtype)

    def backward(self, dloss, cache, defer=None):
        c, err, dtype = cache
        return self.out.backward((err * dloss).astype(dtype, copy=False), c, defer)


class MLPModel(Stage):
    def __init__(self, cfg, seed=0, dtype="float32", layers=None, first=True, last=True):
        dtype = resolve_dtype(dtype)
        self.cfg = cfg
        layers = range(cfg.n_layer) if layers is None else layers
        # fan-in scaled initialisation keeps the signal alive through a deep stack without residuals
        self.embed = Linear("inp", cfg.d_in, cfg.d_model, cfg.d_in ** -0.5, seed, dtype) if first else None
        self.blocks = [MLP(f"layers.{i}", cfg.d_model, cfg.d_ff, cfg.n_layer, 0.0, seed, dtype,
                           std=cfg.d_model ** -0.5) for i in layers]
        self.head = SquaredErrorHead(cfg, seed, dtype) if last else None
        self.mark_matrices()
