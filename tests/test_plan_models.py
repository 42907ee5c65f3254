"""Model shapes (hpcpar/tools/plan/models.py): presets against their papers' parameter counts, dims, files."""
import pytest

from hpcpar.tools.plan.models import load_model, parse_dims, presets
from hpcpar.runtime import UsageError


@pytest.mark.parametrize("name, seq, billions, tolerance", [
    ("gpt3-175b", 2048, 174.6, 0.05),    # Narayanan et al. 2021, Table 2: 174.6 B
    ("mt-nlg-530b", 2048, 529.6, 0.5),   # Narayanan et al. 2021, Table 1: the same shape, 529.6 B
    ("bloom-176b", 2048, 176.247, 0.01), # BigScience tr11 README: 176,247M
    ("gpt2", 1024, 0.124, 0.001),        # GPT-2 small, 124M
    ("llama-70b", 4096, 69.0, 0.1),      # Llama 2 70B: 68.98 B in the released checkpoint
])
def test_parameter_counts_match_the_papers(name, seq, billions, tolerance):
    assert abs(load_model(name).params(seq) / 1e9 - billions) <= tolerance


def test_gpt_block_is_12h2_plus_13h():
    m = parse_dims("l=3,h=64,a=4,V=100")
    assert m.layer_params() == 12 * 64**2 + 13 * 64
    # P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)) with tied embeddings and learned positions (+ final LN)
    assert m.params(32) == 3 * (12 * 64**2 + 13 * 64) + (100 + 32) * 64 + 2 * 64


def test_dims_accept_gqa_gated_untied():
    m = parse_dims("l=2,h=64,a=8,kv=2,f=96,gated=1,tied=0,biases=0,V=50")
    assert (m.kv_heads, m.ffn, m.gated, m.tied) == (2, 96, True, False)
    assert m.qkv_width == 64 + 2 * 2 * 8
    assert m.layer_params() == 64 * 96 + 64 * 64 + 3 * 64 * 96 + 2 * 64


def test_a_toml_file_is_a_model(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("layers = 2\nhidden = 32\nheads = 2\nvocab = 10\n")
    assert load_model(str(path)).name == "mine"


@pytest.mark.parametrize("spec", ["nope", "l=2,h=30,a=4,V=5", "l=2,h=32", "l=x,h=32,a=2,V=3", "l=2,h=32,a=2,V=3,zz=1",
                                  "missing.toml"])
def test_bad_models_are_refused_in_one_line(spec):
    with pytest.raises(UsageError):
        load_model(spec)


def test_every_preset_loads():
    assert {"gpt2", "gpt3-175b", "llama-70b"} <= set(presets())
    for name in presets():
        assert load_model(name).source
