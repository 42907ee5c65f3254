"""Optimizers against PyTorch's, the learning-rate schedule, and gradient clipping."""
import math

import numpy as np
import pytest

from hpcpar.data_parallel.flat import FlatSlice
from hpcpar.optim import AdamW, SGD, clip_coefficient, learning_rate, make_optimizer
from hpcpar.runtime import UsageError
from reference import need


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_update_matches_pytorch(name):
    torch = need("torch")
    rng = np.random.default_rng(0)
    p = rng.standard_normal(64)
    ref = torch.tensor(p.copy(), requires_grad=True)
    if name == "adamw":
        ours = AdamW(1e-2, (0.9, 0.95), 1e-8, 0.1)
        theirs = torch.optim.AdamW([ref], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    else:
        ours = SGD(1e-2, momentum=0.9, weight_decay=0.1)
        theirs = torch.optim.SGD([ref], lr=1e-2, momentum=0.9, weight_decay=0.0)
        ours.weight_decay = 0.0                  # torch's SGD couples weight decay into g; ours decouples
    data = p.copy()
    for _ in range(6):
        g = rng.standard_normal(64)
        ours.step([FlatSlice(0, data, g, [(0, 64)])], 1e-2)
        ref.grad = torch.tensor(g)
        theirs.step()
    np.testing.assert_allclose(data, ref.detach().numpy(), rtol=0, atol=1e-14)


def test_weight_decay_only_on_decayed_ranges():
    data, grad = np.ones(4), np.zeros(4)
    SGD(0.5, weight_decay=0.2).step([FlatSlice(0, data, grad, [(0, 2)])], 0.5)
    np.testing.assert_allclose(data, [0.9, 0.9, 1.0, 1.0])


def test_learning_rate_schedule():
    lrs = [learning_rate(s, 1.0, 0.1, 4, 20) for s in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]                      # linear warm-up
    assert lrs[4] == 1.0 and abs(lrs[-1] - (0.1 + 0.45 * (1 + math.cos(math.pi * 15 / 16)))) < 1e-12
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:]))         # cosine decay never rises


def test_clip_coefficient():
    assert clip_coefficient(0.5, 1.0) == 1.0
    assert abs(clip_coefficient(4.0, 1.0) * 4.0 - 1.0) < 1e-6
    assert clip_coefficient(100.0, 0.0) == 1.0                    # 0 disables clipping


def test_unknown_optimizer():
    with pytest.raises(UsageError, match="unknown optimizer"):
        make_optimizer("lamb", 1e-3)
