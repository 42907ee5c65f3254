"""Qwen3-MoE in and out on one rank: transformers' Qwen3MoeForCausalLM from a small random config (QK-norm
gains and routers drawn at random, top-k renormalised or not), saved locally, loads into hpcpar
(--init-from: QK-norm on, the experts stacked) with transformers' loss in float64 (1e-10), the per-layer
load-balancing loss equal to transformers' load_balancing_loss_func layer by layer, an export that loads
back into transformers with the same loss and the same tensors, and what hpcpar does not compute
refused in one line that names it.  Its heads are wider than hidden / heads, as every released Qwen3's
(Qwen3-30B-A3B: 32 heads of 128 over a hidden size of 2048): head_dim 16 over 32 / 4 = 8."""
import numpy as np
import pytest

from hf_helpers import assert_export_round_trip, assert_transformers_loss_and_aux_loss, hf_moe, save_hf
from hpcpar.checkpoint.consolidated import export
from hpcpar.runtime import UsageError
from test_own_models import adopted, batch, from_file

QWEN3_MOE_DIMS = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=40, moe_intermediate_size=24,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=61,
                      max_position_embeddings=24, rms_norm_eps=1e-5, num_experts=4, num_experts_per_tok=2,
                      norm_topk_prob=True, rope_parameters={"rope_type": "default", "rope_theta": 500.0})


@pytest.fixture
def solo():
    from mpi4py import MPI
    return MPI.COMM_SELF


def hf_qwen3_moe(seed=0, dtype="float64", **dims):
    """A Qwen3MoeForCausalLM with random weights (every norm gain, QK-norm's too), run by transformers'
    eager expert loop."""
    return hf_moe("Qwen3Moe", {**QWEN3_MOE_DIMS, **dims}, seed, dtype)


def raw_tensors(path):
    """{name: array} of a safetensors file as it is on disk."""
    from safetensors.numpy import load_file
    return load_file(str(path))


def loaded(solo, path, **flags):
    t = from_file(solo, path, model="", dtype="float64", seq_len=12, batch_size=3, kv_heads=0, synthetic_vocab=29,
                  **flags)
    x, y = batch(QWEN3_MOE_DIMS["vocab_size"])
    t.data.batch = lambda step, ids: (x[list(ids)], y[list(ids)])
    return t


@pytest.mark.parametrize("norm_topk", [True, False], ids=["renormalised", "raw-top-k"])
def test_hugging_face_qwen3_moe_gives_transformers_loss_and_aux_loss(solo, tmp_path, norm_topk):
    model = hf_qwen3_moe(norm_topk_prob=norm_topk)
    save_hf(model, tmp_path / "hf")
    t = loaded(solo, tmp_path / "hf", aux_loss_coef=0.02)
    assert t.cfg.model == "qwen3-moe-tiny"           # the family comes from the file
    assert (t.mcfg.n_expert, t.mcfg.top_k, t.mcfg.d_ff, t.mcfg.qk_norm, t.mcfg.norm_topk) == (4, 2, 24, True,
                                                                                              norm_topk)
    assert t.mcfg.head_size == 16 and t.chunks[0].blocks[0].attn.qkv.parts[0].weight.data.shape == (32, 64)
    assert_transformers_loss_and_aux_loss(t, model, *batch(QWEN3_MOE_DIMS["vocab_size"]), 0.02)


def test_qwen3_moe_export_loads_into_transformers_with_the_same_loss(solo, tmp_path):
    save_hf(hf_qwen3_moe(seed=1, norm_topk_prob=False), tmp_path / "hf")
    t = loaded(solo, tmp_path / "hf")
    export(t, tmp_path / "same")                     # before any step: the file's own tensors, as they were
    theirs, ours = (raw_tensors(tmp_path / d / "model.safetensors") for d in ("hf", "same"))
    assert sorted(ours) == sorted(theirs)            # the same names (experts one by one, prefixed) ...
    for name, w in theirs.items():                   # ... the same layouts and numbers
        np.testing.assert_array_equal(ours[name], w, err_msg=name)
    model, back = assert_export_round_trip(t, tmp_path, lambda path: loaded(solo, path),
                                           *batch(QWEN3_MOE_DIMS["vocab_size"]))
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and model.config.num_experts == 4
    assert model.config.norm_topk_prob is False and model.model.layers[0].self_attn.q_norm.weight.shape == (16,)
    assert back.mcfg.qk_norm and not back.mcfg.norm_topk               # a lone file says both


def test_a_qwen3_moe_with_a_sliding_window_gives_transformers_loss(solo, tmp_path):
    """use_sliding_window with sliding_window 5 over windows of 12 tokens loads as --window 5; a window
    given but not used (use_sliding_window false) is no window."""
    model = hf_qwen3_moe(seed=2, use_sliding_window=True, sliding_window=5)
    save_hf(model, tmp_path / "hf")
    t = loaded(solo, tmp_path / "hf", aux_loss_coef=0.02)
    assert t.mcfg.window == 5
    assert_transformers_loss_and_aux_loss(t, model, *batch(QWEN3_MOE_DIMS["vocab_size"]), 0.02)
    save_hf(hf_qwen3_moe(dtype="float32", sliding_window=5), tmp_path / "unused")
    assert adopted(tmp_path / "unused", model="").window == 0


@pytest.mark.parametrize("change, message", [
    (dict(mlp_only_layers=[1]), r"mlp_only_layers = \[1\] in its config is not supported"),
    (dict(decoder_sparse_step=2), "decoder_sparse_step = 2 in its config is not supported"),
    (dict(attention_bias=True), "attention_bias = True in its config is not supported"),
], ids=["mlp-only-layers", "sparse-step", "attention-bias"])
def test_what_hpcpar_does_not_compute_is_refused_named(tmp_path, change, message):
    save_hf(hf_qwen3_moe(dtype="float32", **change), tmp_path / "hf")
    with pytest.raises(UsageError, match=message) as err:
        adopted(tmp_path / "hf", model="qwen3-moe-tiny")
    assert "\n" not in str(err.value)


def test_a_qwen3_moe_file_names_its_family(tmp_path):
    save_hf(hf_qwen3_moe(dtype="float32"), tmp_path / "hf")
    assert adopted(tmp_path / "hf", model="").model == "qwen3-moe-tiny"      # no --model: the file's family
    with pytest.raises(UsageError, match=r"--model mixtral-tiny contradicts .* which holds a Qwen3-MoE "
                                         r"\(Qwen3MoeForCausalLM\)"):
        adopted(tmp_path / "hf", model="mixtral-tiny")
    with pytest.raises(UsageError, match="--no-norm-topk contradicts"):
        adopted(tmp_path / "hf", model="", norm_topk=False)
    assert adopted(tmp_path / "hf", model="").head_dim == 16                  # its heads, wider than 32 / 4
    with pytest.raises(UsageError, match="--head-dim 8 contradicts --init-from .* which has 16"):
        adopted(tmp_path / "hf", model="", head_dim=8)
