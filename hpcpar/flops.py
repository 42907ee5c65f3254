"""How much arithmetic a training step is (how fast this machine does it: gemm_speed.py).

Model FLOPs of one training step of a GPT (forward + backward, no recomputation; Narayanan et al.
2021, eq. 3, generalised to any feed-forward width F):

    per token and layer:  forward 2 (4 C^2 + 2 C F) for the GEMMs + 4 T C for attention (QK^T and PV)
    per token, head:      forward 2 C V
    training = 3 x forward (backward costs two forwards)

For F = 4C this is 72 B T L C^2 (1 + T/(6C) + V/(12 L C)), the formula in docs/design.md (FLOPs).
A packed window of documents (or a sliding window) charges attention the keys ``shape.attention_span``
says instead of T: the sum over its documents.
A Llama block differs in two GEMM widths: K and V project to NKV*HS columns, not C (grouped-query
attention), and its SwiGLU MLP has three C x F projections (gate, up, down), not two; with a head_dim
given (Qwen3) Q, the output projection and the attention core are NH*HS wide instead of C.  With experts a
token goes through the router (C x E) and k + shared experts' MLPs: the active FLOPs.  The per-token
counts are the model shape's (hpcpar/shape.py), which the planner counts with as well.

``Gemm`` is one matrix multiply: the planner counts a layer's GEMMs (tools/plan/flops.py) and the benchmarks
time them (tools/bench/gemm.py).
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Gemm:
    """One matrix multiply (m x k) @ (k x n), repeated over ``count`` independent pairs."""
    name: str
    m: int
    n: int
    k: int
    count: int = 1          # independent copies (batched: one per head and sequence)
    weight: bool = True     # True: backward has a weight-gradient GEMM (W); False: attention core
    layout: str = "nn"      # operands as stored: "nn", "nt" (B stored (n, k)) or "tn" (A stored (k, m))

    @property
    def flops(self):
        return 2 * self.m * self.n * self.k * self.count

    @property
    def elements(self):
        """Elements read and written once each: both inputs and the output."""
        return (self.m * self.k + self.k * self.n + self.m * self.n) * self.count

    def label(self):
        return f"{self.m} x {self.k} x {self.n}" + (f" (x{self.count})" if self.count > 1 else "")


def gpt_block_forward_flops(cfg, span=None):
    """Forward FLOPs of one block per token: its shape's (hpcpar/shape.py) at the training length, or
    charged with ``span`` keys (a packed window's ``attention_span``)."""
    return cfg.shape.block_forward_flops(cfg.seq_len if span is None else span)


def gpt_head_forward_flops(cfg):
    """Forward FLOPs of the output projection per token."""
    return cfg.shape.head_forward_flops()


def gpt_step_flops(cfg, tokens, span=None):
    """A training step's FLOPs: 3 forwards of every block, the head and the MTP modules (shape.py); the
    attention charged with ``span`` keys a token (a packed window's ``attention_span``; None: seq_len)."""
    return 3 * cfg.shape.forward_flops(cfg.seq_len if span is None else span) * tokens


def mlp_step_flops(cfg, samples):
    C, F = cfg.d_model, cfg.d_ff
    per_sample = 2 * (cfg.d_in * C + cfg.n_layer * 2 * C * F + C * cfg.d_out)
    return 3 * per_sample * samples


def newton_schulz_flops(kept, summed, steps):
    """FLOPs of ``steps`` quintic Newton-Schulz iterations (optim/newton_schulz.py) on a matrix whose Gram
    sums over ``summed`` numbers and is ``kept`` x ``kept``: each iteration A = X X^T (2 k^2 s), A A
    (2 k^3), B X (2 k^2 s).  A whole matrix keeps its short side and sums over the long one; a piece
    cut over tensor-parallel ranks sums over its share of the cut side (the distributed mode)."""
    return steps * (4 * kept * kept * summed + 2 * kept ** 3)
