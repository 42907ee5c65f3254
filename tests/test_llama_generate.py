"""Sampling from a Llama (rotary positions, grouped-query K/V heads) with the KV cache: the cached forward
gives the full forward's logits, a checkpoint of ``hpcpar train`` loads and generates (in process and on
the command line), and Hugging Face's LlamaForCausalLM agrees on logits and greedy tokens."""
import numpy as np
import pytest

from hf_helpers import LLAMA_DIMS, hf_llama, save_hf
from hpcpar.training.generate import forward_cached, generate, load_model, new_cache
from hpcpar.nn.gpt import GPT, preset
from mpitools import hpcpar, run

# 4 query heads on 2 K/V heads, a rotary base that is not the default: positions must be read, not assumed
TRAIN = ["--layers", "2", "--hidden", "32", "--heads", "4", "--seq-len", "16", "--steps", "2", "--dtype",
         "float64", "--no-progress"]
LLAMA = ["--model", "llama-tiny", "--kv-heads", "2", "--rope-theta", "500"]


def full_logits(model, ids):
    """logits (B, T, V) of the training path: the whole sequence at once, T x T attention, no cache."""
    h, _ = model.embed.forward(ids)
    for block in model.blocks:
        h, _ = block.forward(h)
    return model.head.ln_f.forward(h)[0] @ model.head.weight.data.T


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{family: (checkpoint directory, export directory)} of two-step ``hpcpar train`` runs on one rank."""
    out = {}
    for family, flags in (("llama", LLAMA), ("gpt2", ["--model", "tiny"])):
        where = tmp_path_factory.mktemp(family)
        proc, _ = run(hpcpar() + ["train"] + TRAIN + flags + ["--save", str(where / "ck"), "--export",
                                                                str(where / "out")], timeout=120)
        assert proc.returncode == 0, proc.stderr
        out[family] = where / "ck", where / "out"
    return out


def test_kv_cache_gives_the_logits_of_the_full_forward():
    cfg = preset("llama-tiny", vocab_size=50, d_model=32, d_ff=40, rope_theta=500.0)
    assert cfg.n_kv_head < cfg.n_head
    model = GPT(cfg, seed=3, dtype="float64")
    ids = np.random.default_rng(1).integers(0, 50, size=(2, 16))
    kv = new_cache(model, 2, 16)
    assert kv[0][0].shape == (2, cfg.n_kv_head, 16, 8)              # the K/V heads, not one per query head
    pieces = [forward_cached(model, ids[:, :5], kv, 0),                # a prompt,
              forward_cached(model, ids[:, 5:9], kv, 5)]               # more of it after the cache,
    pieces += [forward_cached(model, ids[:, n:n + 1], kv, n) for n in range(9, 16)]   # then one at a time
    # the same sums in another order (query rows against the cache, the K/V heads broadcast instead of
    # repeated): equal to float64 round-off, not bit for bit
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full_logits(model, ids), rtol=1e-12, atol=1e-13)


def test_a_checkpoint_loads_the_weights_of_its_export(trained):
    for family, (ck, out) in trained.items():
        a, _ = load_model(ck, "float64")
        b, _ = load_model(out, "float64")
        assert a.cfg == b.cfg and a.cfg.arch == family
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert p.name == q.name
            np.testing.assert_array_equal(p.data, q.data)              # the same numbers, two file formats
    llama = load_model(trained["llama"][0])[0].cfg
    assert (llama.n_head, llama.n_kv_head, llama.rope_theta, llama.n_positions) == (4, 2, 500.0, 16)


def test_greedy_generation_from_a_checkpoint_is_the_argmax_of_the_full_forward(trained):
    model, tokenizer = load_model(trained["llama"][0], "float64")
    assert tokenizer is None                                            # synthetic data: ids only
    got = generate(model, [3, 1, 4], 12, temperature=0)
    ids = [3, 1, 4]
    for _ in range(12):                                                 # the whole text again at each token
        ids.append(int(np.argmax(full_logits(model, np.array([ids]))[0, -1])))
    assert got == ids


def test_sampling_is_seeded_and_top_1_is_greedy(trained):
    model, _ = load_model(trained["llama"][0], "float64")
    a = generate(model, [1], 12, temperature=2.0, seed=3)
    assert a == generate(model, [1], 12, temperature=2.0, seed=3)      # the same draw, the same machine
    assert a != generate(model, [1], 12, temperature=2.0, seed=4)
    assert generate(model, [1], 12, temperature=0.7, top_k=1, seed=5) == generate(model, [1], 12, temperature=0)


def test_the_command_line_generates_from_a_llama_checkpoint(trained):
    ck = trained["llama"][0]
    proc, _ = run(hpcpar() + ["generate", str(ck), "--max-tokens", "10", "--temperature", "0", "--dtype",
                              "float64"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    model, _ = load_model(ck, "float64")
    assert proc.stdout.split() == [str(t) for t in generate(model, [0], 10, temperature=0)]
    proc, _ = run(hpcpar() + ["generate", str(ck), "--max-tokens", "20"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "hpcpar: error: 1 prompt tokens + --max-tokens 20 exceed the model's 16 positions"


@pytest.mark.parametrize("head_dim", [8, 12], ids=["hidden-over-heads", "wider-heads"])
def test_hugging_face_llama_gives_transformers_logits_and_greedy_tokens(tmp_path, head_dim):
    """Heads of hidden / heads = 8, or of 12 (a Qwen3's shape: q 48 wide over hidden 32), cached as they are."""
    model = hf_llama(**LLAMA_DIMS, head_dim=head_dim)                    # skips without transformers
    import torch
    save_hf(model, tmp_path / "hf")
    ours, _ = load_model(tmp_path / "hf", "float64")
    assert new_cache(ours, 1, 21)[0][0].shape == (1, 2, 21, head_dim)
    prompt = [3, 14, 15, 9, 26]
    tokens = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=0)[0]
    assert generate(ours, prompt, 16, temperature=0) == tokens.tolist()
    with torch.no_grad():
        want = model(input_ids=tokens[None]).logits.numpy()                   # (1, 21, V), the whole text
    ids, kv = tokens[None].numpy(), new_cache(ours, 1, 21)
    got = [forward_cached(ours, ids[:, :5], kv, 0)] + [forward_cached(ours, ids[:, n:n + 1], kv, n)
                                                       for n in range(5, 21)]
    # two implementations, different kernels and orders of summation: float64 round-off apart
    np.testing.assert_allclose(np.concatenate(got, axis=1), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_hugging_face_mixtures_of_experts_generate_transformers_greedy_tokens(tmp_path, family):
    """A Mixtral's and a Qwen3-MoE's directory generate as a Llama's does: the experts (and QK-norm) from
    the file, transformers' greedy tokens and logits."""
    if family == "mixtral":
        from test_moe_hf import hf_mixtral as build
    else:
        from test_qwen3_moe_hf import hf_qwen3_moe as build
    model = build()                                                      # skips without transformers
    import torch
    save_hf(model, tmp_path / "hf")
    ours, _ = load_model(tmp_path / "hf", "float64")
    assert ours.cfg.n_expert == 4 and ours.cfg.qk_norm == (family == "qwen3_moe")
    assert ours.cfg.head_size == (16 if family == "qwen3_moe" else 8)       # Qwen3's wider than hidden / heads
    prompt = [3, 14, 15, 9, 26]
    tokens = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)[0]
    assert generate(ours, prompt, 12, temperature=0) == tokens.tolist()
    with torch.no_grad():
        want = model(input_ids=tokens[None]).logits.numpy()
    got = forward_cached(ours, tokens[None].numpy(), new_cache(ours, 1, 17), 0)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
