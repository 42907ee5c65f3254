"""DeepSeek-V3 in and out on one rank: transformers' DeepseekV3ForCausalLM from a small random config (queries
through their latent or not, YaRN or plain RoPE, interleaved rotary features or not, group-limited routing
with its scaling factor and a routing bias of its own, a first dense layer), saved locally, loads into
hpcpar with its family and sizes from config.json and gives transformers' loss in float64 (1e-10); its
export is the same file, tensor for tensor, and loads back into transformers with the same loss after two
steps; greedy generation from the cached latent gives transformers' tokens; MTP modules written by
transformers' MtpModel under DeepSeek's names (layers L, L+1) load, give its MTP loss, and are written back
under the same names; what hpcpar does not compute is refused in one line that names it."""
import numpy as np
import pytest

from hf_helpers import deepseek_in_its_dtype, hf_deepseek, hf_loss, save_hf, transformers
from hpcpar.checkpoint.consolidated import export
from hpcpar.runtime import UsageError
from test_own_models import adopted, batch, from_file

YARN = {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0, "original_max_position_embeddings": 6,
        "beta_fast": 8, "beta_slow": 1, "mscale": 0.7, "mscale_all_dim": 1.0}
DIMS = dict(num_hidden_layers=3, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=61, max_position_embeddings=24, n_routed_experts=4, num_experts_per_tok=2,
            n_group=2, topk_group=1, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=12, kv_lora_rank=8,
            qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, routed_scaling_factor=2.5, rms_norm_eps=1e-5,
            rope_parameters=YARN, num_mtp_layers=0)
VARIANTS = {"q-lora-yarn-interleaved": {},
            "q-proj-plain-rope-halves": dict(q_lora_rank=None, rope_interleave=False, v_head_dim=12,
                                             rope_parameters={"rope_type": "default", "rope_theta": 500.0})}


@pytest.fixture
def solo():
    from mpi4py import MPI
    return MPI.COMM_SELF


def loaded(solo, path, **flags):
    t = from_file(solo, path, model="", dtype="float64", seq_len=12, batch_size=3, kv_heads=0, ffn=0,
                  synthetic_vocab=29, **flags)
    x, y = batch(DIMS["vocab_size"])
    t.data.batch = lambda step, ids: (x[list(ids)], y[list(ids)])
    return t


def load_deepseek(directory):
    """transformers' model of our export, in float64 throughout: its router's weight and bias, which it
    keeps in float32 on loading (_keep_in_fp32_modules_strict), kept in float64 too."""
    tf = transformers()
    import torch
    cls, strict = tf.DeepseekV3ForCausalLM, tf.DeepseekV3ForCausalLM._keep_in_fp32_modules_strict
    cls._keep_in_fp32_modules_strict = []
    try:
        model = cls.from_pretrained(str(directory), dtype=torch.float64, attn_implementation="eager",
                                    experts_implementation="eager")
    finally:
        cls._keep_in_fp32_modules_strict = strict
    return deepseek_in_its_dtype(model.eval())


def raw(path):
    from safetensors.numpy import load_file
    return load_file(str(path))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_hugging_face_deepseek_v3_gives_transformers_loss(solo, tmp_path, variant):
    model = hf_deepseek({**DIMS, **VARIANTS[variant]})
    save_hf(model, tmp_path / "hf")
    t = loaded(solo, tmp_path / "hf")
    assert t.cfg.model == "deepseek-tiny" and t.mcfg.arch == "deepseek_v3"       # the family from config.json
    m = t.mcfg
    assert (m.first_dense, m.d_ff, m.d_ff_dense, m.n_group, m.routed_scale, m.kv_lora_rank) == (1, 16, 48, 2, 2.5, 8)
    assert (m.yarn is not None) == (variant == "q-lora-yarn-interleaved") and m.mtp_depth == 0
    x, y = batch(DIMS["vocab_size"])
    assert float(t.gradients(0)[0]) / t.loss_terms == pytest.approx(hf_loss(model, x, y), rel=1e-10)


def test_export_is_the_file_and_loads_back_with_the_same_loss(solo, tmp_path):
    save_hf(hf_deepseek(DIMS, seed=1), tmp_path / "hf")
    t = loaded(solo, tmp_path / "hf")
    export(t, tmp_path / "same")                     # before any step: the file's own tensors, as they were
    theirs, ours = raw(tmp_path / "hf/model.safetensors"), raw(tmp_path / "same/model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for name, w in theirs.items():
        np.testing.assert_array_equal(ours[name], w, err_msg=name)
    for s in range(2):
        t.step(s)
    export(t, tmp_path / "out")
    export(t, tmp_path / "one.safetensors")
    x, y = batch(DIMS["vocab_size"])
    assert hf_loss(load_deepseek(tmp_path / "out"), x, y) == pytest.approx(float(t.gradients(5)[0]) / t.loss_terms,
                                                                          rel=1e-10)
    back = loaded(solo, tmp_path / "one.safetensors")                # a lone file records its config
    for p, q in zip(back.parameters(), t.parameters()):
        np.testing.assert_array_equal(p.data, q.data)


def test_greedy_generation_gives_transformers_tokens(tmp_path):
    import torch
    from hpcpar.training.generate import generate, load_model
    model = hf_deepseek(DIMS, seed=2)
    save_hf(model, tmp_path / "hf")
    prompt = [3, 17, 5, 41]
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False).tolist()[0]
    ours, _ = load_model(tmp_path / "hf", dtype="float64")
    assert generate(ours, prompt, 8, temperature=0) == want
    from mpitools import hpcpar, run
    proc, _ = run(hpcpar() + ["generate", str(tmp_path / "hf"), "--temperature", "0", "--max-tokens", "3"])
    assert proc.returncode == 0 and proc.stdout.split()[:1] == ["0"]           # no tokenizer: the ids
    # 3 layers x (8 + 4) float32 numbers, against 4 heads of (10 + 5) keys and values
    assert proc.stderr.startswith("KV cache: 144 bytes a token (3 layers x the latent (8) and the rotary key (4)); "
                                  "the 4 heads' own keys and values would take 720 (5.0 x)"), proc.stderr


def with_mtp(model, directory, depth):
    """transformers' MtpModel of ``depth`` modules (random weights, norm gains and routers too) written into the
    save_pretrained file under DeepSeek's names - layers L + k - 1, the block's tensors beside enorm, hnorm,
    eh_proj, shared_head.norm and the copies of the embedding and head - as DeepSeek releases them."""
    import torch
    from safetensors.numpy import save_file
    from transformers.modeling_layers import MtpModel
    mtp = MtpModel(model, depth).to(torch.float64).eval()
    with torch.no_grad():                            # (its experts are left uninitialised: drawn here)
        for name, p in mtp.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.3)
            elif ".experts." in name:
                p.normal_(0.0, 0.02)
        for name, b in mtp.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    tensors, L = raw(directory / "model.safetensors"), model.config.num_hidden_layers
    for name, w in mtp.state_dict().items():
        k, rest = name.removeprefix("layers.").split(".", 1)
        rest = rest.removeprefix("mtp_block.").replace("post_norm.", "shared_head.norm.")
        w = w.numpy()
        if rest.startswith("mlp.experts."):          # stacked in the model, one by one in the file
            F = w.shape[1] // 2 if rest.endswith("gate_up_proj") else w.shape[2]
            for j in range(len(w)):
                base = f"model.layers.{L + int(k)}.mlp.experts.{j}"
                if rest.endswith("gate_up_proj"):
                    tensors[f"{base}.gate_proj.weight"], tensors[f"{base}.up_proj.weight"] = w[j, :F], w[j, F:]
                else:
                    tensors[f"{base}.down_proj.weight"] = w[j]
        elif not name.startswith(("embed_tokens", "shared_head")):
            tensors[f"model.layers.{L + int(k)}.{rest}"] = np.ascontiguousarray(w)
    for k in range(depth):
        tensors[f"model.layers.{L + k}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
        tensors[f"model.layers.{L + k}.shared_head.head.weight"] = tensors["lm_head.weight"]
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return deepseek_in_its_dtype(mtp)


def transformers_mtp_loss(model, mtp, x, y, lam):
    """(lambda / D) sum_k L_k / (B T) by transformers' MtpModel: module k reads the model's last hidden state
    (after its final norm) or module k - 1's, and the token t_{i+k} (0 past the end, where nothing counts)."""
    import torch
    with torch.no_grad():
        h = model.model(input_ids=torch.as_tensor(x)).last_hidden_state
        B, T = x.shape
        total, positions = 0.0, torch.arange(T)[None].expand(B, T)
        for k in range(len(mtp.layers)):
            ids = torch.zeros((B, T), dtype=torch.long)
            ids[:, :T - k] = torch.as_tensor(y[:, k:])
            h = mtp.forward_layer(k, h, positions, None, input_ids=ids)
            logits = mtp._project_to_logits(h)[:, :T - k - 1]
            total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                             torch.as_tensor(y[:, k + 1:]).reshape(-1),
                                                             reduction="sum"))
    return lam / len(mtp.layers) * total / (B * T)


def test_mtp_modules_load_under_deepseeks_names_and_give_transformers_mtp_loss(solo, tmp_path):
    model = hf_deepseek({**DIMS, "num_hidden_layers": 2, "num_mtp_layers": 2}, seed=3)
    save_hf(model, tmp_path / "hf")
    mtp = with_mtp(model, tmp_path / "hf", 2)
    t = loaded(solo, tmp_path / "hf", mtp_lambda=0.3)
    assert t.mcfg.mtp_depth == 2 and t.chunks[0].head.mtp.depths[1].block.layer == 3       # layers 2, 3
    x, y = batch(DIMS["vocab_size"])
    want = transformers_mtp_loss(model, mtp, x, y, 0.3)
    result = t.step(0)
    assert result.loss == pytest.approx(hf_loss(model, x, y), rel=1e-10)
    assert t.mtp_loss == pytest.approx(want, rel=1e-10)
    t2 = loaded(solo, tmp_path / "hf", mtp_lambda=0.3)
    export(t2, tmp_path / "same")                    # the MTP modules, and their copies, under the file's names
    theirs, ours = raw(tmp_path / "hf/model.safetensors"), raw(tmp_path / "same/model.safetensors")
    assert sorted(ours) == sorted(theirs) and "model.layers.3.shared_head.head.weight" in ours
    for name, w in theirs.items():
        np.testing.assert_array_equal(ours[name], w, err_msg=name)
    with pytest.raises(UsageError, match="--mtp 1 contradicts --init-from .* which has 2"):
        adopted(tmp_path / "hf", mtp=1)


@pytest.mark.parametrize("change, message", [
    (dict(hidden_act="gelu"), "hidden_act = 'gelu' in its config is not supported"),
    (dict(scoring_func="softmax"), "scoring_func = 'softmax' in its config is not supported"),
    (dict(topk_method="group_limited_greedy"), "topk_method = 'group_limited_greedy' in its config is not supported"),
    (dict(num_key_value_heads=2), "num_key_value_heads = 2 in its config is not supported"),
    (dict(rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}), "rope_type 'linear' is not"),
], ids=["activation", "softmax-router", "v2-topk", "kv-heads", "linear-rope"])
def test_what_hpcpar_does_not_compute_is_refused_named(tmp_path, change, message):
    import json
    save_hf(hf_deepseek(DIMS, dtype="float32"), tmp_path / "hf")
    with pytest.raises(UsageError, match=r"--model llama-tiny contradicts .* which holds a DeepSeek-V3"):
        adopted(tmp_path / "hf", model="llama-tiny")
    config = json.loads((tmp_path / "hf/config.json").read_text())
    (tmp_path / "hf/config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(UsageError, match=message) as err:
        adopted(tmp_path / "hf")
    assert "\n" not in str(err.value)
