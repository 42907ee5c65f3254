"""Mixtral in and out on one rank: transformers' MixtralForCausalLM from a small random config, saved
locally, loads into hpcpar (--init-from, the experts stacked) with transformers' loss in float64 (1e-10),
the per-layer load-balancing loss equals transformers' load_balancing_loss_func applied layer by layer,
an export loads back into transformers with the same loss, and what hpcpar does not compute is refused."""
import numpy as np
import pytest

from hf_helpers import hf_loss, in_its_dtype, load_hf, save_hf, transformers
from hpcpar.checkpoint.consolidated import export
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
    tf = transformers()                      # skips before torch is imported
    import torch
    torch.manual_seed(seed)
    config = tf.MixtralConfig(bos_token_id=None, eos_token_id=None, pad_token_id=None, **{**MIXTRAL_DIMS, **dims})
    config._experts_implementation = "eager"
    model = tf.MixtralForCausalLM(config).eval().to(getattr(torch, dtype))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
            elif "mlp.gate.weight" in name:
                p.normal_(0.0, 0.3)                         # a router with opinions: varied choices
    return in_its_dtype(model)


def loaded(solo, path, **flags):
    t = from_file(solo, path, model="mixtral-tiny", dtype="float64", seq_len=12, batch_size=3, kv_heads=0,
                  synthetic_vocab=29, **flags)
    x, y = batch(MIXTRAL_DIMS["vocab_size"])
    t.data.batch = lambda step, ids: (x[list(ids)], y[list(ids)])
    return t


def test_hugging_face_mixtral_gives_transformers_loss_and_aux_loss(solo, tmp_path):
    transformers()                           # skips before torch is imported
    import torch
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    model = hf_mixtral()
    save_hf(model, tmp_path / "hf")
    x, y = batch(MIXTRAL_DIMS["vocab_size"])
    t = loaded(solo, tmp_path / "hf", aux_loss_coef=0.02)
    assert (t.mcfg.n_expert, t.mcfg.top_k, t.mcfg.d_ff) == (4, 2, 24)
    ours = float(t.gradients(0)[0]) / t.loss_terms
    assert ours == pytest.approx(hf_loss(model, x, y), rel=1e-10)
    # the auxiliary loss is ours per layer; transformers' function of one layer's router logits is the same
    # (it sums in float32: equal to float32's round-off)
    with torch.no_grad():
        logits = model(input_ids=torch.as_tensor(x), output_router_logits=True).router_logits
    want = sum(float(load_balancing_loss_func((g,), 4, 2)) for g in logits)
    assert t.expert_load.step()["aux_loss"] == pytest.approx(0.02 * want, rel=1e-6)


def test_mixtral_export_loads_into_transformers_with_the_same_loss(solo, tmp_path):
    save_hf(hf_mixtral(seed=1), tmp_path / "hf")
    t = loaded(solo, tmp_path / "hf")
    for s in range(2):
        t.step(s)
    export(t, tmp_path / "out")
    export(t, tmp_path / "one.safetensors")
    ours = float(t.gradients(5)[0]) / t.loss_terms
    model = load_hf(tmp_path / "out")
    model.config._experts_implementation = "eager"
    assert type(model).__name__ == "MixtralForCausalLM" and model.config.num_local_experts == 4
    assert hf_loss(model, *batch(MIXTRAL_DIMS["vocab_size"])) == pytest.approx(ours, rel=1e-10)
    back = loaded(solo, tmp_path / "one.safetensors")
    for p, q in zip(back.parameters(), t.parameters()):       # a lone file holds the same numbers
        np.testing.assert_array_equal(p.data, q.data)


@pytest.mark.parametrize("change, message", [
    (dict(sliding_window=8), "sliding_window = 8 in its config is not supported"),
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
