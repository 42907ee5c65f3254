"""DeepSeek-V3 and Kimi K2 in the planner (hpcpar/tools/plan/models/*.toml, hpcpar/shape.py): their parameter counts
as published, and the KV cache per token MLA keeps against the keys and values it stands for."""
from dataclasses import replace

from hpcpar.tools.plan.models import load_model


def test_deepseek_v3_counts_as_published():
    """671B total, 37B activated (the report's abstract, truncated to the billion); the MTP module with its
    copies of the embedding and head makes the released files' 684.5B, which its README rounds up to 685B
    (671B + 14B: the module 13.5B)."""
    m = load_model("deepseek-v3")
    total, active, mtp = m.params(4096), m.active_params(4096), m.mtp_params() + 2 * m.token_params()
    assert int(total / 1e9) == 671 and int(active / 1e9) == 37
    assert 684e9 < total + mtp <= 685e9 and 13e9 < mtp <= 14e9


def test_kimi_k2_counts_as_published():
    """Its model card: 1T total, 32B activated; the report's 1.04 T is the count with all 61 layers experts."""
    m = load_model("kimi-k2")
    assert round(m.params(0) / 1e12) == 1 and int(m.active_params(0) / 1e9) == 32
    assert round(replace(m, dense_layers=0).params(0) / 1e12, 2) == 1.04


def test_the_latent_cache_per_token():
    """V3 caches 61 x (512 + 64) numbers a token (69 KiB in bf16), 71 times fewer than the 128 heads' keys
    (192) and values (128) it stands for; Llama 3 70B's grouped-query cache: 80 x 2 x 8 x 128."""
    v3 = load_model("deepseek-v3")
    assert v3.kv_cache_per_token() == 61 * 576 and 2 * v3.kv_cache_per_token() / 1024 == 68.625
    expanded = v3.layers * v3.heads * (v3.head_dim + v3.v_head_dim)
    assert round(expanded / v3.kv_cache_per_token()) == 71
    assert load_model("llama3-70b").kv_cache_per_token() == 80 * 2 * 8 * 128
