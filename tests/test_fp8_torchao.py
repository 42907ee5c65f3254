"""FP8 against an outside implementation: torchao's float8 training (Float8LinearConfig, emulate=True:
its GEMMs multiply the dequantised values in fp32) on a small Llama from transformers, recipes
"tensorwise" and "rowwise", every linear layer but the output head converted - what hpcpar's
--precision fp8-tensorwise and fp8-rowwise quantise.  With --dtype float32 (fp8 GEMMs, fp32 everywhere
else, as Float8Linear in an fp32 model):

* the same operand gives the same quantised GEMM input, bit for bit (torchao's quantiser run on the
  values hpcpar's first projections quantised: activations and weights);
* the forward loss is the same to fp32 round-off.

A reference test: skips without torch, transformers or torchao (.venv/bin/pip install torchao==0.18.0,
the version that runs with torch 2.13)."""
import dataclasses

import numpy as np
import pytest

from hf_helpers import hf_llama, hf_loss, save_hf
from reference import REASON

DIMS = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=61, max_position_embeddings=24, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0})
RECIPE = {"tensorwise": "fp8-tensorwise", "rowwise": "fp8-rowwise"}


def torchao():
    pytest.importorskip("torch", reason=f"{REASON}: torch is not installed")
    return pytest.importorskip("torchao.float8", reason=f"{REASON}: torchao is not installed "
                                                          f"(.venv/bin/pip install torchao==0.18.0)")


def tokens(B=3, T=12, seed=5):
    ids = np.random.default_rng(seed).integers(0, DIMS["vocab_size"], size=(B, T + 1))
    return ids[:, :-1], ids[:, 1:]


def hpcpar_run(directory, precision):
    """(forward loss, {(gemm, operand): (the operand, what the GEMM got)} of layer 0's q_proj)."""
    from mpi4py import MPI
    from hpcpar.checkpoint.consolidated import init_from
    from train_helpers import trainer
    t = trainer(MPI.COMM_SELF, model="llama-tiny", init_from=str(directory), layers=0, hidden=0, heads=0,
                synthetic_vocab=29, seq_len=12, batch_size=3, dtype="float32", precision=precision)
    init_from(t, directory)
    x, y = tokens()
    t.data.batch = lambda step, ids: (x[list(ids)], y[list(ids)])
    q = t.low_precision.layers["layers.0.self_attn.q_proj"]
    seen, plain = {}, q.quantise

    def watched(which, operand, a, contraction, segment):
        seen.setdefault((which, operand), (a.copy(), plain(which, operand, a, contraction, segment)))
        return seen[(which, operand)][1]
    q.quantise = watched
    return float(t.gradients(0)[0]) / t.loss_terms, seen


def torchao_quantised(ao, a, recipe):
    """torchao's quantiser on the array ``a`` (rows x contraction), dequantised."""
    import torch
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig
    rowwise = recipe == "rowwise"
    f8 = hp_tensor_to_float8_dynamic(torch.as_tensor(a), torch.float8_e4m3fn, LinearMMConfig(),
                                     scaling_granularity=ScalingGranularity.AXISWISE if rowwise else
                                     ScalingGranularity.TENSORWISE, axiswise_dim=-1 if rowwise else None,
                                     round_scales_to_power_of_2=rowwise)
    return f8.to_original_precision().numpy()


@pytest.mark.parametrize("recipe", sorted(RECIPE))
def test_torchao_float8_gives_the_same_quantised_inputs_and_forward_loss(tmp_path, recipe):
    ao = torchao()
    model = hf_llama(dtype="float32", **DIMS)
    save_hf(model, tmp_path / "hf")
    ours, seen = hpcpar_run(tmp_path / "hf", RECIPE[recipe])
    x, w = seen[("forward", "x")], seen[("forward", "w")]
    np.testing.assert_array_equal(torchao_quantised(ao, x[0], recipe), x[1])           # (N, K), along K
    np.testing.assert_array_equal(torchao_quantised(ao, w[0].T, recipe).T, w[1])       # torchao's (out, in)
    config = dataclasses.replace(ao.Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    ao.convert_to_float8_training(model, config=config, module_filter_fn=lambda mod, fqn: fqn != "lm_head")
    assert sum(type(m).__name__ == "Float8Linear" for m in model.modules()) == 2 * 7
    want = hf_loss(model, *tokens())
    assert ours == pytest.approx(want, rel=2e-6)
    assert abs(ours - hf_loss(hf_llama(dtype="float32", **DIMS), *tokens())) > 1e-4      # fp8 is not fp32
