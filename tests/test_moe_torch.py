"""Our MoE block against transformers' own blocks in float64: Mixtral's (MixtralSparseMoeBlock: softmax,
top-2, renormalised) and Qwen3-MoE's (Qwen3MoeSparseMoeBlock, with and without norm_topk_prob), their
experts run by transformers' eager loop over experts.  The output, the input gradient and every
parameter gradient (the router's included) agree to 1e-10.

Both routers compute their softmax in float32 whatever the model's dtype (a cast in their code); for a
float64 reference the router here runs the same formula in float64."""
import numpy as np
import pytest

from hf_helpers import float64_router, transformers
from hpcpar.nn.gpt import preset
from hpcpar.nn.moe import MoE

C, F, E = 16, 12, 5


def _hf_block(kind, top_k, normalise, seed=0):
    tf = transformers()                      # skips before torch is imported
    import torch
    torch.manual_seed(seed)
    dims = dict(hidden_size=C, intermediate_size=F, num_experts_per_tok=top_k, num_attention_heads=4)
    if kind == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
        config = tf.MixtralConfig(num_local_experts=E, **dims)
        config._experts_implementation = "eager"
        block = MixtralSparseMoeBlock(config)
    else:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
        config = tf.Qwen3MoeConfig(num_experts=E, moe_intermediate_size=F, norm_topk_prob=normalise, **dims)
        config._experts_implementation = "eager"
        block = Qwen3MoeSparseMoeBlock(config)
    block = block.double()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.5)
    block.gate.forward = lambda h: float64_router(block.gate, h, normalise)
    return block


def _ours(block, top_k, normalise):
    cfg = preset("mixtral-tiny", vocab_size=8, d_model=C, d_ff=F, n_expert=E, top_k=top_k, norm_topk=normalise)
    moe = MoE("layers.0.mlp", cfg, 0, np.float64)
    moe.gate.weight.data[...] = block.gate.weight.detach().numpy().T                       # (C, E)
    moe.experts.gate_up.data[...] = block.experts.gate_up_proj.detach().numpy().transpose(0, 2, 1)   # (E, C, 2F)
    moe.experts.down.data[...] = block.experts.down_proj.detach().numpy().transpose(0, 2, 1)        # (E, F, C)
    return moe


@pytest.mark.parametrize("kind, top_k, normalise", [("mixtral", 2, True), ("qwen3_moe", 2, False),
                                                    ("qwen3_moe", 3, True)])
def test_moe_block_matches_transformers(kind, top_k, normalise):
    transformers()                           # skips before torch is imported
    import torch
    block = _hf_block(kind, top_k, normalise)
    moe = _ours(block, top_k, normalise)
    rng = np.random.default_rng(5)
    x, R = rng.standard_normal((2, 7, C)), rng.standard_normal((2, 7, C))
    xt = torch.tensor(x, requires_grad=True)
    yt = block(xt)
    (yt * torch.tensor(R)).sum().backward()
    y, cache = moe.forward(x)
    dx = moe.backward(R, cache)

    def close(a, b, what):
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err < 1e-10, f"{kind} {what}: relative difference {err:.1e}"
    close(y, yt.detach().numpy(), "output")
    close(dx, xt.grad.numpy(), "dx")
    close(moe.gate.weight.grad, block.gate.weight.grad.numpy().T, "router gradient")
    close(moe.experts.gate_up.grad, block.experts.gate_up_proj.grad.numpy().transpose(0, 2, 1), "gate_up gradient")
    close(moe.experts.down.grad, block.experts.down_proj.grad.numpy().transpose(0, 2, 1), "down gradient")
