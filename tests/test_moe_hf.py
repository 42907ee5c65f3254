"""Mixtral in and out on one rank: transformers' MixtralForCausalLM from a small random config, saved
locally, loads into hpcpar (--init-from, the experts stacked) with transformers' loss in float64 (1e-10),
the per-layer load-balancing loss equals transformers' load_balancing_loss_func applied layer by layer,
an export loads back into transformers with the same loss, and what hpcpar does not compute is refused."""
import pytest

from hf_helpers import assert_export_round_trip, assert_transformers_loss_and_aux_loss, hf_moe, save_hf
from hpcpar.runtime import UsageError
from test_own_models import adopted, batch, from_file

MIXTRAL_DIMS = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=24, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=61, max_position_embeddings=24, rms_norm_eps=1e-5,
                    num_local_experts=4, num_experts_per_tok=2, rope_parameters={"rope_type": "default",
                                                                                 "rope_theta": 500.0})


@pytest.fixture
def solo():
    from mpi4py import MPI
    return MPI.COMM_SELF


def hf_mixtral(seed=0, dtype="float64", **dims):
    """A MixtralForCausalLM with random weights (norm gains too), run by transformers' eager expert loop."""
    return hf_moe("Mixtral", {**MIXTRAL_DIMS, **dims}, seed, dtype)


def loaded(solo, path, **flags):
    t = from_file(solo, path, model="mixtral-tiny", dtype="float64", seq_len=12, batch_size=3, kv_heads=0,
                  synthetic_vocab=29, **flags)
    x, y = batch(MIXTRAL_DIMS["vocab_size"])
    t.data.batch = lambda step, ids: (x[list(ids)], y[list(ids)])
    return t


def test_hugging_face_mixtral_gives_transformers_loss_and_aux_loss(solo, tmp_path):
    model = hf_mixtral()
    save_hf(model, tmp_path / "hf")
    t = loaded(solo, tmp_path / "hf", aux_loss_coef=0.02)
    assert (t.mcfg.n_expert, t.mcfg.top_k, t.mcfg.d_ff) == (4, 2, 24)
    assert_transformers_loss_and_aux_loss(t, model, *batch(MIXTRAL_DIMS["vocab_size"]), 0.02)


def test_mixtral_export_loads_into_transformers_with_the_same_loss(solo, tmp_path):
    save_hf(hf_mixtral(seed=1), tmp_path / "hf")
    model, _ = assert_export_round_trip(loaded(solo, tmp_path / "hf"), tmp_path, lambda path: loaded(solo, path),
                                        *batch(MIXTRAL_DIMS["vocab_size"]))
    assert type(model).__name__ == "MixtralForCausalLM" and model.config.num_local_experts == 4


def test_a_mixtral_with_a_sliding_window_gives_transformers_loss(solo, tmp_path):
    """sliding_window 5 over windows of 12 tokens: each query sees at most 5 keys (--window 5)."""
    model = hf_mixtral(seed=2, sliding_window=5)
    save_hf(model, tmp_path / "hf")
    t = loaded(solo, tmp_path / "hf", aux_loss_coef=0.02)
    assert (t.mcfg.window, t.mcfg.window_layers) == (5, "")
    assert_transformers_loss_and_aux_loss(t, model, *batch(MIXTRAL_DIMS["vocab_size"]), 0.02)


@pytest.mark.parametrize("change, message", [
    (dict(router_jitter_noise=0.1), "router_jitter_noise = 0.1 in its config is not supported"),
])
def test_what_hpcpar_does_not_compute_is_refused_named(tmp_path, change, message):
    save_hf(hf_mixtral(dtype="float32", **change), tmp_path / "hf")
    with pytest.raises(UsageError, match=message):
        adopted(tmp_path / "hf", model="mixtral-tiny")


def test_a_mixtral_file_names_its_family(tmp_path):
    save_hf(hf_mixtral(dtype="float32"), tmp_path / "hf")
    assert adopted(tmp_path / "hf", model="").model == "mixtral-tiny"      # no --model: the file's family
    with pytest.raises(UsageError, match=r"--model llama-tiny contradicts .* which holds a Mixtral \(MixtralForCausalLM\)"):
        adopted(tmp_path / "hf", model="llama-tiny")
    with pytest.raises(UsageError, match="--experts 8 contradicts"):
        adopted(tmp_path / "hf", model="mixtral-tiny", experts=8)
