"""Hugging Face's GPT-2 and Llama as the independent references: random weights from a GPT2Config or a
LlamaConfig, no download.

Tests that use these helpers skip cleanly when transformers (or torch) is not installed (reference.py).
"""
import numpy as np

from reference import need

# A small LlamaConfig: 4 query heads on 2 K/V heads, a rotary base and an epsilon that are not the
# defaults, so that they must be read from the files, not assumed
LLAMA_DIMS = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=40, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=61, max_position_embeddings=24, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0})


def transformers():
    return need("torch", "transformers")


def hf_model(seed=0, dtype="float64", **dims):
    """A GPT2LMHeadModel with random weights (dropout off); ``dims`` are GPT2Config's (n_layer, n_embd, ...)."""
    tf = transformers()                      # skips before torch is imported
    import torch
    torch.manual_seed(seed)
    config = tf.GPT2Config(bos_token_id=None, eos_token_id=None, **dims)
    model = tf.GPT2LMHeadModel(config).eval()
    return model.to(getattr(torch, dtype))


def hf_llama(seed=0, dtype="float64", **dims):
    """A LlamaForCausalLM with random weights; ``dims`` are LlamaConfig's (hidden_size, ...).  Its norm
    gains, ones at initialisation, are drawn at random too, so that a misplaced gain cannot hide."""
    tf = transformers()                      # skips before torch is imported
    import torch
    torch.manual_seed(seed)
    config = tf.LlamaConfig(bos_token_id=None, eos_token_id=None, pad_token_id=None, **dims)
    model = tf.LlamaForCausalLM(config).eval().to(getattr(torch, dtype))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
    return in_its_dtype(model)


def hf_moe(kind, dims, seed=0, dtype="float64"):
    """A MixtralForCausalLM or Qwen3MoeForCausalLM (``kind``: "Mixtral" or "Qwen3Moe") with random weights
    - every norm gain too, and a router with opinions (varied choices) - run by transformers' eager loop
    over the experts; ``dims`` are its config's."""
    tf = transformers()                      # skips before torch is imported
    import torch
    torch.manual_seed(seed)
    config = getattr(tf, f"{kind}Config")(bos_token_id=None, eos_token_id=None, pad_token_id=None, **dims)
    config._experts_implementation = "eager"
    model = getattr(tf, f"{kind}ForCausalLM")(config).eval().to(getattr(torch, dtype))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
            elif "mlp.gate.weight" in name:
                p.normal_(0.0, 0.3)
    return in_its_dtype(model)


def in_its_dtype(model):
    """transformers' Llama (and Mixtral, Qwen3-MoE) computes RMSNorm and the rotary angles (Mixtral,
    Qwen3-MoE: and the router's softmax) in float32 whatever the model's dtype
    (casts written into its code), which in a float64 model costs float32 round-off (1e-7).  For a
    float64 reference those two run here in the model's dtype, with the same formulas; other models and
    dtypes are left as they are."""
    import torch
    if model.config.model_type not in ("llama", "mixtral", "qwen3_moe") or model.dtype != torch.float64:
        return model
    for m in model.modules():
        kind = type(m).__name__                     # LlamaRMSNorm, MixtralRMSNorm, ...
        if kind.endswith("TopKRouter"):             # the router: its softmax, too, in float32
            m.forward = lambda h, m=m: float64_router(m, h, getattr(m, "norm_topk_prob", True))
        elif kind.endswith("RMSNorm"):              # the blocks' and (Qwen3-MoE) QK-norm's
            m.forward = lambda h, m=m: m.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True)
                                                                  + m.variance_epsilon))
        elif kind.endswith("RotaryEmbedding"):
            HS = model.config.head_dim or model.config.hidden_size // model.config.num_attention_heads
            inv_freq = 1.0 / model.config.rope_parameters["rope_theta"] ** (
                torch.arange(0, HS, 2, dtype=torch.float64) / HS)

            def rotary(x, position_ids, inv_freq=inv_freq):
                angles = position_ids[..., None].double() * inv_freq                  # (B, T, HS/2)
                angles = torch.cat((angles, angles), dim=-1)
                return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
            m.forward = rotary
    return model


def float64_router(gate, h, normalise=True):
    """Mixtral's (Qwen3-MoE's) TopKRouter.forward with the softmax in the model's dtype."""
    import torch
    logits = torch.nn.functional.linear(h.reshape(-1, gate.hidden_dim), gate.weight)
    top, idx = torch.topk(torch.softmax(logits, dim=-1), gate.top_k, dim=-1)
    return logits, (top / top.sum(dim=-1, keepdim=True) if normalise else top), idx


def save_hf(model, directory, prefixed=True):
    """save_pretrained: GPT2LMHeadModel's names (``transformer.`` prefix), or its GPT2Model's (none)."""
    (model if prefixed else model.transformer).save_pretrained(str(directory))
    return directory


def hf_loss(model, inputs, targets):
    """Mean next-token cross-entropy of the batch, computed by transformers (in the model's dtype)."""
    import torch
    with torch.no_grad():
        logits = model(input_ids=torch.as_tensor(np.asarray(inputs))).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.as_tensor(np.asarray(targets)).reshape(-1))
    return float(loss)


def load_hf(directory, dtype="float64"):
    """The model of a save_pretrained directory, GPT-2 or Llama (the class its config.json names)."""
    tf = transformers()                      # skips before torch is imported
    import torch
    model = tf.AutoModelForCausalLM.from_pretrained(str(directory), dtype=getattr(torch, dtype))
    return in_its_dtype(model.eval())


def assert_transformers_loss_and_aux_loss(t, model, inputs, targets, coef):
    """hpcpar's Trainer ``t`` gives transformers' loss of the batch (float64, 1e-10), and a load-balancing
    loss of ``coef`` x transformers' load_balancing_loss_func of each layer's router logits, summed over the
    layers (ours is per layer; transformers sums in float32: equal to float32's round-off)."""
    import importlib

    import pytest
    import torch
    ours = float(t.gradients(0)[0]) / t.loss_terms
    assert ours == pytest.approx(hf_loss(model, inputs, targets), rel=1e-10)
    aux = importlib.import_module(type(model).__module__).load_balancing_loss_func     # the model's own file
    with torch.no_grad():
        logits = model(input_ids=torch.as_tensor(inputs), output_router_logits=True).router_logits
    want = sum(float(aux((g,), model.num_experts, model.num_experts_per_tok)) for g in logits)
    assert t.expert_load.step()["aux_loss"] == pytest.approx(coef * want, rel=1e-6)


def assert_export_round_trip(t, directory, reload, inputs, targets):
    """Two steps, then an export to a directory and to a lone file: transformers loads the directory
    with hpcpar's loss of the batch (float64, 1e-10), ``reload`` the lone file with the same numbers.
    Returns (transformers' model, the reloaded Trainer)."""
    import pytest
    from hpcpar.checkpoint.consolidated import export
    for s in range(2):
        t.step(s)
    export(t, directory / "out")
    export(t, directory / "one.safetensors")
    ours = float(t.gradients(5)[0]) / t.loss_terms
    model = load_hf(directory / "out")
    model.config._experts_implementation = "eager"
    assert hf_loss(model, inputs, targets) == pytest.approx(ours, rel=1e-10)
    back = reload(directory / "one.safetensors")
    for p, q in zip(back.parameters(), t.parameters()):       # a lone file holds the same numbers
        np.testing.assert_array_equal(p.data, q.data)
    return model, back


def hf_deepseek(dims, seed=0, dtype="float64"):
    """A DeepseekV3ForCausalLM with random weights - every norm gain, a router with opinions and a routing bias
    of its own - run by transformers' eager attention and expert loop; ``dims`` are its config's."""
    tf = transformers()                      # skips before torch is imported
    import torch
    torch.manual_seed(seed)
    config = tf.DeepseekV3Config(bos_token_id=None, eos_token_id=None, pad_token_id=None, **dims)
    config._experts_implementation, config._attn_implementation = "eager", "eager"
    model = tf.DeepseekV3ForCausalLM(config).eval().to(getattr(torch, dtype))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    return deepseek_in_its_dtype(model)


def deepseek_in_its_dtype(model):
    """transformers' DeepSeek-V3 computes its norms, rotary tables (YaRN's frequencies too), router and
    attention softmax in float32 whatever the model's dtype; for a float64 reference they run here in
    float64 with the same formulas - YaRN's by transformers' own function, run with float32 standing for
    float64 (its softmax in float32 alone costs 1e-10 of the loss: measured)."""
    import importlib

    import torch
    from transformers import modeling_rope_utils
    if model.dtype != torch.float64:
        return model
    importlib.import_module(type(model).__module__).eager_attention_forward = float64_eager_attention
    config = model.config
    kind = config.rope_parameters.get("rope_type", "default")
    saved = torch.float, torch.float32
    torch.float = torch.float32 = torch.float64
    try:
        inv_freq, factor = modeling_rope_utils.ROPE_INIT_FUNCTIONS[kind](config) if kind != "default" else \
            (1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, config.qk_rope_head_dim, 2) /
                                                            config.qk_rope_head_dim), 1.0)
    finally:
        torch.float, torch.float32 = saved
    inv_freq = inv_freq.to(torch.float64)

    def rotary(x, position_ids):
        angles = position_ids[..., None].double() * inv_freq                        # (B, T, dr/2)
        angles = torch.cat((angles, angles), dim=-1)
        return (angles.cos() * factor).to(x.dtype), (angles.sin() * factor).to(x.dtype)

    for m in model.modules():
        kind = type(m).__name__
        if kind.endswith("RMSNorm"):
            m.forward = lambda h, m=m: m.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + m.variance_epsilon))
        elif kind.endswith("RotaryEmbedding"):
            m.forward = rotary
        elif kind.endswith("TopkRouter"):
            m.forward = lambda h, m=m: deepseek_router(m, h)
    return model


def deepseek_router(gate, h):
    """DeepseekV3TopkRouter.forward in the model's dtype (its float32 casts left out)."""
    import torch
    h = h.reshape(-1, gate.hidden_dim)
    logits = torch.nn.functional.linear(h, gate.weight.to(h.dtype))
    scores = logits.sigmoid()
    choice = scores + gate.e_score_correction_bias.to(h.dtype)
    group = choice.view(-1, gate.num_group, gate.num_experts // gate.num_group).topk(2, dim=-1)[0].sum(dim=-1)
    keep = torch.zeros_like(group).scatter_(1, torch.topk(group, k=gate.topk_group, dim=-1)[1], 1)
    keep = keep.unsqueeze(-1).expand(-1, gate.num_group, gate.num_experts // gate.num_group).reshape(len(h), -1)
    idx = torch.topk(choice.masked_fill(~keep.bool(), float("-inf")), k=gate.top_k, dim=-1)[1]
    w = scores.gather(1, idx)
    if gate.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return logits, w * gate.routed_scaling_factor, idx


def float64_eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers' eager_attention_forward with the softmax in the inputs' dtype (MLA: as many K/V heads
    as heads, nothing to repeat)."""
    import torch
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.nn.functional.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights
