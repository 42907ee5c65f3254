"""The engine against PyTorch autograd, float64: same weights, same batch -> same loss and gradients.

The PyTorch model below is written independently from torch primitives (the textbook GPT-2), so an
error would have to be made twice, in two different ways, to go unnoticed.
"""
import math

import numpy as np
import pytest

from hpcpar.nn import GPT, GPTConfig
from reference import need

torch = need("torch")
F = torch.nn.functional


def torch_gpt_loss(w, ids, targets, cfg):
    """GPT-2 forward in torch: w maps Hugging Face names to leaf tensors (requires_grad)."""
    B, T = ids.shape
    C, nh = cfg.d_model, cfg.n_head
    x = w["wte.weight"][ids] + w["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(cfg.n_layer):
        p = lambda k: w[f"h.{i}.{k}"]  # noqa: E731
        a = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), eps=cfg.ln_eps)
        q, k, v = (a @ p("attn.c_attn.weight") + p("attn.c_attn.bias")).split(C, dim=-1)
        q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // nh)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        m = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), eps=cfg.ln_eps)
        m = F.gelu(m @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"), approximate="tanh")
        x = x + m @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], eps=cfg.ln_eps)
    head = w["wte.weight"] if cfg.tied else w["lm_head.weight"]
    logits = x @ head.T
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@pytest.mark.parametrize("tied", [True, False])
def test_gpt_matches_pytorch_autograd(tied):
    cfg = GPTConfig(vocab_size=37, seq_len=12, n_layer=2, n_head=4, d_model=16, tied=tied)
    model = GPT(cfg, seed=11, dtype="float64")
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, cfg.vocab_size, size=(4, cfg.seq_len + 1))
    ids, targets = tokens[:, :-1], tokens[:, 1:]

    loss_sum, caches = model.forward(ids, None, targets)
    model.backward(1.0 / targets.size, caches)          # mean over tokens, as torch's cross_entropy
    ours = {p.name: p for p in model.parameters()}

    w = {n: torch.tensor(p.data, dtype=torch.float64, requires_grad=True) for n, p in ours.items()}
    ref = torch_gpt_loss(w, torch.tensor(ids), torch.tensor(targets), cfg)
    ref.backward()

    assert abs(loss_sum / targets.size - ref.item()) <= 1e-10 * abs(ref.item())
    for name, p in ours.items():
        want = w[name].grad.numpy()
        err = np.linalg.norm(p.grad - want) / np.linalg.norm(want)
        assert err <= 1e-10, f"{name}: relative gradient error {err:.1e}"
