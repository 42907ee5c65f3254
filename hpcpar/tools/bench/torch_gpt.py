"""GPT-2 in PyTorch eager: the baseline the engine benchmarks compare against.

Written with ``torch.nn`` modules the way a PyTorch user would (nanoGPT's shape), so that the
baseline is ordinary PyTorch, not a port of our engine:

    x = wte[ids] + wpe[:T];  per block: x += attn(ln_1(x));  x += mlp(ln_2(x));  logits = ln_f(x) W^T

Attention is the explicit "textbook" form (Q K^T, causal mask, softmax, times V) - the same
arithmetic as hpcpar/ops/attention.py - unless ``sdpa`` asks for PyTorch's fused
``scaled_dot_product_attention`` kernel (reported separately: it is a different algorithm).

Two details exist for the distributed baselines:

* ``fused_qkv=False`` gives separate q, k, v projections: DTensor's ``ColwiseParallel`` cuts a
  weight's output columns contiguously, which on a fused [Q | K | V] would hand rank 0 all of Q and
  half of K.  The head count is read off the projection width, so a tensor-parallel rank that holds
  NH / tp heads runs the same forward.
* ``Stage`` holds a slice of the model (embedding on the first, head on the last), for
  ``torch.distributed.pipelining``; its last stage returns logits and the loss is the schedule's.

Importing this module needs torch; callers check ``torch_version()`` first.
"""
import math

import torch
from torch import nn

F = nn.functional


class Attention(nn.Module):
    def __init__(self, C, n_head, seq_len, fused_qkv=True, sdpa=False):
        super().__init__()
        self.head_size, self.sdpa = C // n_head, sdpa
        self.register_buffer("future", torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1), persistent=False)
        if fused_qkv:
            self.c_attn = nn.Linear(C, 3 * C)
        else:
            self.q, self.k, self.v = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, _ = x.shape
        if hasattr(self, "c_attn"):
            q, k, v = self.c_attn(x).chunk(3, dim=-1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        nh = q.shape[-1] // self.head_size                     # heads on this rank
        q, k, v = (t.reshape(B, T, nh, self.head_size).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_size))
            s = s.masked_fill(self.future[:T, :T], float("-inf"))
            o = s.softmax(dim=-1) @ v
        return self.c_proj(o.transpose(1, 2).reshape(B, T, nh * self.head_size))


class Block(nn.Module):
    def __init__(self, cfg, fused_qkv=True, sdpa=False):
        super().__init__()
        C = cfg.d_model
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.attn = Attention(C, cfg.n_head, cfg.seq_len, fused_qkv, sdpa)
        self.c_fc, self.c_proj = nn.Linear(C, cfg.d_ff), nn.Linear(cfg.d_ff, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Stage(nn.Module):
    """Blocks ``layers`` of a GPT of config ``cfg`` (a GPTConfig), with the embedding if ``first`` and
    the final LayerNorm and (untied) output projection if ``last``.  The whole model is the stage
    with everything; it returns logits (B, T, V)."""

    def __init__(self, cfg, layers=None, first=True, last=True, fused_qkv=True, sdpa=False):
        super().__init__()
        C, layers = cfg.d_model, range(cfg.n_layer) if layers is None else layers
        self.wte = nn.Embedding(cfg.vocab_size, C) if first else None
        self.wpe = nn.Embedding(cfg.seq_len, C) if first else None
        self.h = nn.ModuleList(Block(cfg, fused_qkv, sdpa) for _ in layers)
        self.ln_f = nn.LayerNorm(C) if last else None
        self.lm_head = nn.Linear(C, cfg.vocab_size, bias=False) if last else None

    def forward(self, x):
        if self.wte is not None:
            x = self.wte(x) + self.wpe.weight[:x.shape[1]]
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.lm_head is not None else x


def loss_fn(logits, targets):
    """Mean next-token cross-entropy over every position."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def adamw(module, cfg):
    """torch.optim.AdamW with the hyperparameters of a TrainConfig (hpcpar/training/options.py)."""
    return torch.optim.AdamW(module.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             weight_decay=cfg.weight_decay)


def torch_optimizer(module, cfg):
    """The optimizer a TrainConfig names (``cfg.optimizer``), with its hyperparameters - SGD without
    weight decay: PyTorch's adds it to the gradient (coupled), ours shrinks the weights (decoupled), so
    the two would not compute the same; ours keeps its extra pass, which only favours PyTorch."""
    if cfg.optimizer == "adamw":
        return adamw(module, cfg)
    return torch.optim.SGD(module.parameters(), lr=cfg.lr, momentum=cfg.momentum)
