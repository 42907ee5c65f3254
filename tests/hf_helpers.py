"""Hugging Face's GPT-2 as the independent reference: random weights from a GPT2Config, no download.

Tests that use these helpers skip cleanly when transformers (or torch) is not installed.
"""
import numpy as np
import pytest


def transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def hf_model(seed=0, dtype="float64", **dims):
    """A GPT2LMHeadModel with random weights (dropout off); ``dims`` are GPT2Config's (n_layer, n_embd, ...)."""
    import torch
    tf = transformers()
    torch.manual_seed(seed)
    config = tf.GPT2Config(bos_token_id=None, eos_token_id=None, **dims)
    model = tf.GPT2LMHeadModel(config).eval()
    return model.to(getattr(torch, dtype))


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
    import torch
    return transformers().GPT2LMHeadModel.from_pretrained(str(directory), dtype=getattr(torch, dtype)).eval()
