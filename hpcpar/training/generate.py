"""Sampling text from a trained GPT on one rank, with a KV cache.

A GPT predicts the next token from all the tokens before it.  Sampling repeats: logits of the last
position -> pick a token -> append it -> again.  Running the whole sequence through the model at every
new token would redo the same work each time; the *KV cache* keeps each layer's keys and values of the
tokens already seen, so each new token costs one position's forward (ops/attention.py,
``attention_cached_forward``):

    prefill   logits, cache = forward(prompt (1, T0), positions [0, T0))
    decode    logits, cache = forward(token (1, 1), position n)            n = T0, T0 + 1, ...

A sliding-window layer (``--window``) keeps only its last W keys and values: its cache is a ring
buffer of W slots, however long the text grows (ops/attention.py).  A model trained on documents
(``--documents``) attends within a document only, so given the end-of-text ``separator`` the prompt's
last document is all it reads - positions from 0 at its start - and a document it ends stops the text.

Picking the token: greedy (temperature 0) takes the most likely one; otherwise the logits are divided
by the temperature (< 1 sharper, > 1 flatter), all but the ``top_k`` largest are dropped, and the token
is drawn from the softmax with a generator seeded by ``seed``.

The model, GPT-2 or Llama (with experts: Mixtral, Qwen3-MoE), comes from a checkpoint directory
(hpcpar's own, any layout) or from Hugging Face weights (an ``--export``, or a save_pretrained
directory); the tokenizer is the one saved with them.
What differs between the two families (a position table or rotary positions, all heads or grouped K/V
heads in the cache, LayerNorm or RMSNorm) lives in the modules' own ``forward_cached``.
"""
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from hpcpar.checkpoint.gpt2 import check_tensors
from hpcpar.checkpoint.hf import expected_shapes, read_architecture
from hpcpar.nn.dims import parse_dims
from hpcpar.nn.gpt import GPT, GPTConfig
from hpcpar.runtime import UsageError


def _checkpoint_model(path):
    """(GPTConfig, {name: array}, tokenizer path or None, trained with --documents) of an hpcpar checkpoint
    directory."""
    from hpcpar.checkpoint.convert import open_checkpoint
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.text import tokenizer_of
    from hpcpar.training.models import kind_of, model_config
    reader = open_checkpoint(path)
    saved = reader.manifest.get("config") or {}
    if not saved.get("model"):
        raise UsageError(f"hpcpar generate: {reader.dir} does not record its model (a checkpoint converted from "
                         f"weights): generate from the weights file itself")
    one_rank = dict(tp=1, pp=1, dp=1, chunks=1, microbatches=1, schedule="1f1b", sequence_parallel=False,
                    partition="uniform")
    cfg = TrainConfig(**{**{f.name: saved[f.name] for f in fields(TrainConfig) if f.name in saved}, **one_rank})
    if not kind_of(cfg).sequences:
        raise UsageError(f"{path} holds the MLP model, which does not generate text")
    weights = {n: reader.full(n) for n in reader.names() if not n.startswith("optimizer/")}
    mcfg = model_config(cfg)
    mcfg = replace(mcfg, vocab_size=weights[mcfg.parts.tokens].shape[0])     # the data's, not in the flags
    data = saved.get("data", "synthetic")
    return mcfg, weights, (tokenizer_of(data) if data != "synthetic" and Path(data).exists() else None), \
        bool(saved.get("documents"))


def _weights_model(path):
    """(GPTConfig, {name: array}, tokenizer path or None, False) of Hugging Face weights of any family hpcpar
    runs (a file or a directory): a Mixtral's or Qwen3-MoE's experts and options come with them."""
    from hpcpar.checkpoint.consolidated import read_weights
    from hpcpar.training.text import tokenizer_of
    arch = read_architecture(path, "hpcpar generate")
    if not arch.n_head:
        raise UsageError(f"hpcpar generate: {path} does not say its number of attention heads "
                         f"(put its config.json beside it)")
    unsaid = {k: v for k, v in (("ln_eps", arch.ln_eps), ("rope_theta", arch.rope_theta)) if v}  # else defaults
    experts = dict(n_expert=arch.n_expert, top_k=arch.top_k, norm_topk=arch.norm_topk,
                   n_shared_expert=arch.n_shared_expert, router_score=arch.router_score) if arch.n_expert else {}
    mcfg = GPTConfig(vocab_size=arch.vocab_size, seq_len=arch.n_positions, n_layer=arch.n_layer,
                     n_head=arch.n_head, d_model=arch.d_model, d_ff=arch.d_ff, tied=arch.tied, arch=arch.arch,
                     n_kv_head=arch.n_kv_head, head_dim=arch.head_dim, qk_norm=arch.qk_norm, window=arch.window,
                     window_layers=arch.window_layers, mtp_depth=arch.mtp_depth, **experts, **unsaid,
                     **parse_dims(arch.dims))
    weights = read_weights(path)
    if arch.tied:
        weights.pop("lm_head.weight", None)
    return mcfg, weights, tokenizer_of(path), False


def load_model(path, dtype="float32"):
    """(GPT with every layer on this rank, tokenizer path or None) from a checkpoint or Hugging Face weights."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"hpcpar generate: {path} not found")
    is_checkpoint = path.is_dir() and ((path / "latest").is_file() or (path / "manifest.json").is_file())
    mcfg, weights, tokenizer, documents = (_checkpoint_model if is_checkpoint else _weights_model)(path)
    check_tensors(path, {n: w.shape for n, w in weights.items()}, expected_shapes(mcfg))
    model = GPT(mcfg, dtype=dtype)
    for p in model.parameters():
        p.data[...] = weights[p.name]
    model.documents = documents                  # trained with --documents (generate's separator)
    return model, tokenizer


def forward_cached(model, ids, kv, start):
    """logits (B, T, V) of the tokens ``ids`` (B, T) at positions [start, start + T); ``kv`` holds one
    (k_cache, v_cache) pair per block and gains these tokens' keys and values.  Each part knows its
    family: the embedding adds a position table or not, the attention rotates q and k or not."""
    x = model.embed.forward_cached(ids, start)                           # (B, T, C)
    for block, cache in zip(model.blocks, kv):
        x = block.forward_cached(x, cache, start)
    return model.head.forward_cached(x)


def new_cache(model, batch, length):
    """An empty cache for ``length`` positions, one per block as its attention keeps it: a (k, v) pair of
    (B, NKV, L, HS), NKV the key/value heads (GPT-2: all NH heads; a grouped-query Llama: NH / NKV times
    fewer), or MLA's latent (B, L, r) and rotary key (B, L, dr) (DeepSeek-V3, nn/mla.py); L the length - or
    a sliding-window layer's window, if shorter: all it ever reads."""
    dtype = model.embed.wte.data.dtype
    return [tuple(np.zeros(s, dtype) for s in block.attn.cache_shapes(batch, min(length, block.attn.window or length)))
            for block in model.blocks]


def document_start(ids, separator):
    """Where the last document of ``ids`` starts: after the last ``separator`` but a final one (a prompt
    of the separator alone is a document of one token); 0 without a separator."""
    ends = [i for i, t in enumerate(ids[:-1]) if separator is not None and t == separator]
    return ends[-1] + 1 if ends else 0
def cache_report(cfg, itemsize):
    """One line: the KV cache's bytes per token, against a cache of every head's keys and values."""
    shape = cfg.shape
    mine, heads = shape.kv_cache_per_token(), shape.heads_kv_per_token()
    kind = (f"the latent ({cfg.kv_lora_rank}) and the rotary key ({cfg.qk_rope_dim})" if cfg.parts.latent else
            f"the keys and values of {cfg.n_kv_head} K/V heads of {cfg.head_size}")
    return (f"KV cache: {mine * itemsize:,} bytes a token ({cfg.n_layer} layers x {kind}); the {cfg.n_head} heads' "
            f"own keys and values would take {heads * itemsize:,} ({heads / mine:.1f} x)")


def pick(logits, temperature, top_k, rng):
    """One token id from the logits (V,) of the next position."""
    if temperature == 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if top_k and top_k < z.size:
        z[z < np.partition(z, -top_k)[-top_k]] = -np.inf          # keep the k largest
    p = np.exp(z - z.max())
    return int(rng.choice(z.size, p=p / p.sum()))


def generate(model, prompt, max_tokens, temperature=1.0, top_k=0, seed=0, separator=None):
    """The prompt's token ids followed by up to ``max_tokens`` sampled ones (a list of ints).  With the
    end-of-text ``separator`` (a model trained with --documents): only the prompt's last document is
    read, at positions from 0, and the text stops after the separator that ends it."""
    limit = model.cfg.n_positions
    if not prompt:
        raise UsageError("the prompt must hold at least one token")
    first = document_start(prompt, separator)
    if len(prompt) - first + max_tokens > limit:
        raise UsageError(f"{len(prompt) - first} prompt tokens + --max-tokens {max_tokens} exceed the model's "
                         f"{limit} positions")
    rng = np.random.default_rng(seed)
    kv = new_cache(model, 1, len(prompt) - first + max_tokens)
    ids = list(prompt)
    logits = forward_cached(model, np.array([ids[first:]]), kv, 0)      # prefill: the prompt's document
    for i in range(max_tokens):
        ids.append(pick(logits[0, -1], temperature, top_k, rng))
        if ids[-1] == separator:                                         # the document ends here
            break
        if i + 1 < max_tokens:
            logits = forward_cached(model, np.array([ids[-1:]]), kv, len(ids) - 1 - first)   # one new position
    return ids
