"""Bringing models in and out on one rank: --init-from reads the architecture, Hugging Face's GPT-2 and
Llama load with their loss, exports load back into transformers, and the KV-cache sampler matches the
full forward and transformers' greedy generate."""
import numpy as np
import pytest
from safetensors.numpy import save_file

from hf_helpers import LLAMA_DIMS, hf_llama, hf_loss, hf_model, load_hf, save_hf
from hpcpar.checkpoint.consolidated import export, init_from, read_weights
from hpcpar.training.config import TrainConfig, check
from hpcpar.training.generate import forward_cached, generate, load_model, new_cache
from hpcpar.runtime import UsageError
from mpitools import hpcpar, run
from train_helpers import trainer

HF_DIMS = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=61, n_positions=24)


@pytest.fixture
def solo():
    from mpi4py import MPI
    return MPI.COMM_SELF


@pytest.fixture
def four_layers(solo, tmp_path):
    """A 4-layer, 32-wide, 40-token, 16-position model written by hpcpar (heads in the file's metadata)."""
    t = trainer(solo, layers=4, hidden=32, heads=4, seq_len=16, vocab=40, synthetic_vocab=29)
    export(t, tmp_path / "four.safetensors")
    return tmp_path / "four.safetensors"


def from_file(solo, path, **kw):
    """A Trainer whose dimensions come from ``path`` (the helpers' own dimensions cleared), loaded."""
    t = trainer(solo, init_from=str(path), layers=0, hidden=0, heads=0, **kw)
    init_from(t, path)
    return t


def adopted(path, **flags):
    return check(TrainConfig(init_from=str(path), progress=False, **flags), 1)


@pytest.mark.parametrize("flags, message", [
    (dict(layers=2), "--layers 2 contradicts --init-from"),       # the file has more layers than asked for
    (dict(layers=6), "--layers 6 contradicts --init-from"),       # ... fewer
    (dict(hidden=64), "--hidden 64 contradicts --init-from"),
    (dict(vocab=50), "--vocab 50 contradicts --init-from"),
    (dict(head_dim=16), "--head-dim 16 contradicts --init-from"),     # the file's heads: 32 / 4, stored as 0
], ids=["extra-layers", "missing-layers", "width", "vocabulary", "head-width"])
def test_flags_that_contradict_the_file_are_refused(four_layers, flags, message):
    with pytest.raises(UsageError, match=message) as err:
        adopted(four_layers, **flags)
    assert "which has" in str(err.value) and "\n" not in str(err.value)


def test_contradiction_is_one_line_and_exit_2_on_the_command_line(four_layers):
    proc, _ = run(hpcpar() + ["train", "--init-from", str(four_layers), "--layers", "2", "--steps", "1",
                              "--no-progress"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"hpcpar: error: --layers 2 contradicts --init-from {four_layers}, which has 4"


def test_the_architecture_comes_from_the_file(four_layers):
    cfg = adopted(four_layers)
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.vocab, cfg.positions, cfg.seq_len) == (4, 32, 4, 40, 16, 16)


def test_positions_and_sequence_length_are_separate(solo, four_layers):
    t = from_file(solo, four_layers, seq_len=8)
    assert t.mcfg.seq_len == 8 and t.mcfg.n_positions == 16
    assert np.isfinite(t.step(0).loss)
    with pytest.raises(UsageError, match="--seq-len 32 is longer than the 16 positions"):
        adopted(four_layers, seq_len=32)


@pytest.mark.parametrize("change", ["extra", "missing"])
def test_a_file_with_other_tensors_is_refused_whole(four_layers, tmp_path, change):
    weights = read_weights(four_layers)
    if change == "extra":
        weights["h.0.attn.rotary.weight"] = np.zeros(3, dtype=np.float32)
    else:
        del weights["h.2.mlp.c_fc.bias"]
    save_file(weights, str(tmp_path / "odd.safetensors"), metadata={"n_head": "4"})
    word = "tensors the model does not use: h.0.attn.rotary.weight" if change == "extra" else "missing h.2.mlp.c_fc.bias"
    with pytest.raises(UsageError, match=word):
        adopted(tmp_path / "odd.safetensors")


def batch(vocab, T=12, B=3, seed=5):
    tokens = np.random.default_rng(seed).integers(0, vocab, size=(B, T + 1))
    return tokens[:, :-1], tokens[:, 1:]


def hpcpar_loss(model_dir, dtype, solo, **flags):
    """The loss of one batch through hpcpar's Trainer, weights from ``model_dir``."""
    t = from_file(solo, model_dir, dtype=dtype, seq_len=12, batch_size=3, **flags)
    x, y = batch(HF_DIMS["vocab_size"])
    t.data.batch = lambda step, ids: (x[list(ids)], y[list(ids)])
    return float(t.gradients(0)[0]) / t.loss_terms


@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-10), ("float32", 1e-5)])
@pytest.mark.parametrize("prefixed", [True, False], ids=["GPT2LMHeadModel", "GPT2Model"])
def test_hugging_face_gpt2_gives_transformers_loss(solo, tmp_path, dtype, rtol, prefixed):
    # two implementations, different kernels: equal to round-off of the dtype, not bit for bit
    model = hf_model(dtype=dtype, **HF_DIMS)
    save_hf(model, tmp_path / "hf", prefixed)
    want = hf_loss(model, *batch(HF_DIMS["vocab_size"]))
    got = hpcpar_loss(tmp_path / "hf", dtype, solo, synthetic_vocab=29)
    assert got == pytest.approx(want, rel=rtol)


def test_export_loads_into_transformers_with_the_same_loss(solo, tmp_path):
    t = trainer(solo, layers=3, hidden=32, heads=4, seq_len=12, positions=20, vocab=61, batch_size=3)
    for s in range(2):
        t.step(s)
    export(t, tmp_path / "out")
    x, y = batch(61)
    t.data.batch = lambda step, ids: (x[list(ids)], y[list(ids)])
    ours = float(t.gradients(5)[0]) / t.loss_terms
    model = load_hf(tmp_path / "out")
    assert model.config.n_positions == 20 and model.config.n_layer == 3
    assert hf_loss(model, x, y) == pytest.approx(ours, rel=1e-10)


@pytest.mark.parametrize("dtype, rtol, head_dim", [("float64", 1e-10, 8), ("float32", 1e-5, 8), ("float64", 1e-10, 12)],
                         ids=["float64", "float32", "wider-heads"])
def test_hugging_face_llama_gives_transformers_loss(solo, tmp_path, dtype, rtol, head_dim):
    """Heads of hidden / heads = 8, and of 12 (q 48 wide over hidden 32, as Qwen3's heads are wider)."""
    model = hf_llama(dtype=dtype, **LLAMA_DIMS, head_dim=head_dim)
    save_hf(model, tmp_path / "hf")
    want = hf_loss(model, *batch(LLAMA_DIMS["vocab_size"]))
    got = hpcpar_loss(tmp_path / "hf", dtype, solo, model="llama-tiny", synthetic_vocab=29)
    assert got == pytest.approx(want, rel=rtol)


@pytest.mark.parametrize("head_dim", [0, 12], ids=["hidden-over-heads", "wider-heads"])
def test_llama_export_loads_into_transformers_with_the_same_loss(solo, tmp_path, head_dim):
    t = trainer(solo, model="llama-tiny", layers=3, hidden=32, heads=4, kv_heads=2, seq_len=12, positions=20,
                vocab=61, batch_size=3, rope_theta=500.0, head_dim=head_dim)
    for s in range(2):
        t.step(s)
    export(t, tmp_path / "out")
    export(t, tmp_path / "one.safetensors")
    x, y = batch(61)
    t.data.batch = lambda step, ids: (x[list(ids)], y[list(ids)])
    ours = float(t.gradients(5)[0]) / t.loss_terms
    model = load_hf(tmp_path / "out")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (model.config.num_key_value_heads, model.config.max_position_embeddings) == (2, 20)
    assert model.config.head_dim == (head_dim or 8)
    assert hf_loss(model, x, y) == pytest.approx(ours, rel=1e-10)
    back = from_file(solo, tmp_path / "one.safetensors", model="llama-tiny", kv_heads=0, vocab=0, seq_len=12)
    assert back.mcfg == t.mcfg
    for p, q in zip(back.parameters(), t.parameters()):       # a lone file holds the same numbers
        np.testing.assert_array_equal(p.data, q.data)


def test_a_llama_file_gives_the_family_and_refuses_what_it_does_not_compute(tmp_path):
    model = hf_llama(**LLAMA_DIMS)
    save_hf(model, tmp_path / "hf")
    assert adopted(tmp_path / "hf").model == "llama-tiny"
    with pytest.raises(UsageError, match="--model tiny contradicts --init-from .* which holds a Llama"):
        adopted(tmp_path / "hf", model="tiny")
    model.config.tie_word_embeddings = True
    save_hf(model, tmp_path / "tied")
    with pytest.raises(UsageError, match="tie_word_embeddings = True in its config is not supported"):
        adopted(tmp_path / "tied", model="llama-tiny")


def test_kv_cache_gives_the_logits_of_the_full_forward(tmp_path, solo):
    t = trainer(solo, layers=2, hidden=32, heads=4, seq_len=16, vocab=50)
    t.step(0)
    export(t, tmp_path / "m.safetensors")
    model, _ = load_model(tmp_path / "m.safetensors", "float64")
    ids = np.random.default_rng(1).integers(0, 50, size=(2, 16))
    h, _ = model.embed.forward(ids)
    for block in model.blocks:
        h, _ = block.forward(h)
    full = model.head.ln_f.forward(h)[0] @ model.head.weight.data.T            # (2, 16, V) training path
    kv = new_cache(model, 2, 16)
    pieces = [forward_cached(model, ids[:, :5], kv, 0)]                         # a prompt, then one at a time
    pieces += [forward_cached(model, ids[:, n:n + 1], kv, n) for n in range(5, 16)]
    # the same sums in another order (one query row against the cache instead of a T x T block)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, rtol=1e-12, atol=1e-13)


def test_greedy_generation_equals_transformers(tmp_path):
    model = hf_model(**HF_DIMS)                                          # skips without transformers
    import torch
    save_hf(model, tmp_path / "hf")
    ours, _ = load_model(tmp_path / "hf", "float64")
    prompt = [3, 14, 15, 9]
    got = generate(ours, prompt, 16, temperature=0)
    want = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert got == want[0].tolist()


def test_sampling_is_seeded_and_respects_top_k(tmp_path):
    model = hf_model(**HF_DIMS)
    save_hf(model, tmp_path / "hf")
    ours, _ = load_model(tmp_path / "hf", "float64")
    a = generate(ours, [1], 10, temperature=0.9, top_k=5, seed=3)
    assert a == generate(ours, [1], 10, temperature=0.9, top_k=5, seed=3)
    assert a != generate(ours, [1], 10, temperature=0.9, top_k=5, seed=4)
    with pytest.raises(UsageError, match="exceed the model's 24 positions"):
        generate(ours, [1, 2], 23)


@pytest.mark.parametrize("flags, message", [
    (["--eval-every", "5"], "--eval-every needs a val.bin beside the training tokens (hpcpar data prepare "
                            "writes one); --data synthetic has none"),
    (["--seq-len", "100", "--positions", "64"], "--seq-len 100 is longer than the model's 64 positions"),
])
def test_evaluation_and_positions_misuse_is_one_line(flags, message):
    proc, _ = run(hpcpar() + ["train", "--steps", "1", "--no-progress"] + flags, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == f"hpcpar: error: {message}", proc.stderr
