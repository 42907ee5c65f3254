"""The model a run trains, set up from its options before any rank communicates: its kind, its dimensions
checked against the layout, its data and vocabulary, the state a rank would hold (config.check's last
stage, ``setup``).

Two kinds of model, one entry each of ``MODELS`` (every ``--model``):

    language model   every GPT preset of nn/gpt.py - GPT-2, Llama, the mixtures of experts, DeepSeek-V3:
                     one GPT class whose family is a trait (nn/architectures.py) - reading token sequences
    deep MLP         nn/mlp_model.py, the simplest model to pipeline, on a synthetic regression

The rest of training/ asks a run's kind (``kind_of``) what differs - its stage class, its data, the
activation between two stages, what a sample adds to the loss, the options it has nothing for - and
never tests the model's name.
"""
import importlib.util
import math
import os
from collections import namedtuple
from dataclasses import replace

import numpy as np

from hpcpar import precision
from hpcpar.checkpoint.hf import family as hf_family
from hpcpar.data import MarkovLanguage, Regression, TokenFile, validation_file
from hpcpar.data_parallel.zero_memory import check_budget
from hpcpar.flops import gpt_step_flops, mlp_step_flops
from hpcpar.fp8.layout import refusal as fp8_refusal
from hpcpar.nn import GPT, MLPConfig, MLPModel
from hpcpar.nn.dims import parse_dims
from hpcpar.nn.gpt import PRESETS, preset
from hpcpar.nn.moe import check_moe, moe_options
from hpcpar.ops.masks import windowed_layers
from hpcpar.pipeline.partition import partition
from hpcpar.pipeline.schedules import KINDS
from hpcpar.runtime import UsageError
from hpcpar.tensor_parallel.parallelize import check_divisible
from hpcpar.training.low_precision import recipe_of
from hpcpar.training.text import model_tokenizer, tokenizer_of

Setup = namedtuple("Setup", "mcfg data val_data")      # what config.checked hands the trainer


class LanguageModel:
    """Token sequences in, the next tokens' cross-entropy out: attention, positions, a vocabulary."""
    stage = GPT              # one pipeline stage of the model
    sequences = True         # it reads sequences (sequence and context parallelism, documents, generation)
    lacks = ()               # (refused when, the line): options this kind has nothing for

    def dims(self, cfg):
        """The model's dimensions from the preset and the explicit flags, each refused in one line."""
        heads = cfg.heads or None
        mcfg = preset(cfg.model, n_layer=cfg.layers or None, d_model=cfg.hidden or None, n_head=heads,
                      n_kv_head=cfg.kv_heads or heads, head_dim=cfg.head_dim or None, seq_len=cfg.seq_len or None,
                      dropout=cfg.dropout, tied=False if cfg.untied else None,
                      d_ff=cfg.ffn or (4 * cfg.hidden if cfg.hidden else None),
                      positions=cfg.positions or None, ln_eps=cfg.ln_eps or None, rope_theta=cfg.rope_theta or None,
                      norm_topk=cfg.norm_topk, window=cfg.window or None, window_layers=cfg.window_layers or None,
                      mtp_depth=cfg.mtp or None, mtp_lambda=cfg.mtp_lambda, **moe_options(cfg), **parse_dims(cfg.dims))
        windowed_layers(mcfg.window_layers, mcfg.n_layer)          # a bad --window-layers, refused here
        if mcfg.seq_len > mcfg.n_positions:
            raise UsageError(f"--seq-len {mcfg.seq_len} is longer than the model's {mcfg.n_positions} positions")
        if not mcfg.head_dim and mcfg.d_model % mcfg.n_head:
            raise UsageError(f"--heads {mcfg.n_head} must divide --hidden {mcfg.d_model}")
        if not mcfg.parts.grouped_kv and cfg.kv_heads:
            raise UsageError(f"--kv-heads needs a Llama model (--model llama-tiny or llama-small), not {cfg.model}")
        if mcfg.n_head % mcfg.n_kv_head:
            raise UsageError(f"--kv-heads {mcfg.n_kv_head} must divide the {mcfg.n_head} attention heads")
        if cfg.qk_clip and mcfg.qk_norm:
            raise UsageError("--qk-clip scales W_q and W_k, and QK-norm normalises q and k again: use one of them")
        if not mcfg.parts.dropout and cfg.dropout:
            raise UsageError(f"--model {cfg.model} has no dropout: drop --dropout {cfg.dropout}")
        if mcfg.mtp_depth >= mcfg.seq_len:
            raise UsageError(f"--mtp {mcfg.mtp_depth} leaves no target in a sequence of {mcfg.seq_len} tokens")
        return mcfg

    def check(self, cfg, mcfg):
        """What the layout and the other options ask of these dimensions."""
        check_moe(mcfg, cfg)
        if not (mcfg.n_expert or cfg.norm_topk):
            raise UsageError("--no-norm-topk needs experts: give --experts N or a model with them")
        if cfg.export:
            hf_family(mcfg)                     # refuses, before the run, a model no Hugging Face file holds
        if cfg.on_failure == "shrink" and mcfg.n_expert:
            raise UsageError("--on-failure shrink does not yet go on with a mixture of experts (the routing's "
                             "all-reduce after the update is a second commit point): use --on-failure abort")
        check_divisible(mcfg, cfg.tp, cfg.sequence_parallel, mcfg.seq_len)
        # imported here: context_parallel loads mpi4py, which the option table (options.py) must not, since
        # hpcpar train reads its options before the rank guard forks (watch/rank_guard.py's split)
        from hpcpar.context_parallel import check_context_parallel
        check_context_parallel(cfg.cp, mcfg.seq_len, cfg.tp, cfg.sequence_parallel, cfg.cp_kind, mcfg.n_head,
                               mcfg.n_kv_head)

    def data(self, cfg, mcfg):
        if cfg.data == "synthetic":
            return MarkovLanguage(cfg.synthetic_vocab, cfg.synthetic_order, cfg.synthetic_branching,
                                  seq_len=mcfg.seq_len, seed=cfg.seed, doc_len=cfg.synthetic_doc_len,
                                  skip_boundaries=cfg.documents and not cfg.boundary_targets)
        return TokenFile(cfg.data, mcfg.seq_len, cfg.batch_size, cfg.seed, cfg.data_order, cfg.token_dtype)

    def with_vocab(self, cfg, mcfg, data):
        """A GPT takes its vocabulary from the data unless --vocab (or the preset) fixes it."""
        vocab = cfg.vocab or mcfg.vocab_size or data.vocab_size
        if data.vocab_size > vocab:
            raise UsageError(f"the data has {data.vocab_size} token ids but the model's vocabulary is {vocab}")
        return replace(mcfg, vocab_size=vocab)

    def ties_ends(self, mcfg):
        """Whether the last stage uses the first stage's token embedding (a tied head, the MTP modules)."""
        return bool(mcfg.tied or mcfg.mtp_depth)

    def activation(self, cfg, mcfg, micro):
        """The activation one micro-batch passes between two stages: its tokens on this rank (context
        parallelism holds T / cp of them, sequence parallelism T / (cp tp)), each of d_model numbers."""
        return (micro, mcfg.seq_len // cfg.cp // (cfg.tp if cfg.sequence_parallel else 1), mcfg.d_model)

    def terms(self, mcfg):
        """(loss terms, tokens) of one sample: a target per token."""
        return mcfg.seq_len, mcfg.seq_len

    def step_flops(self, mcfg, cfg, tokens, span=None):
        return gpt_step_flops(mcfg, tokens, span)

    def shape(self, mcfg):
        """The model's parameter and FLOP arithmetic (shape.py), for the planner's rules."""
        return mcfg.shape


class DeepMLP:
    """An input projection, MLP blocks and a squared error against a random teacher (data/synthetic.py):
    the same questions as ``LanguageModel``, other answers."""
    stage = MLPModel
    sequences = False
    lacks = ((lambda c: c.cp > 1, "--cp needs a GPT model (the MLP has no sequence to share)"),
             (lambda c: c.recompute_attention, "--recompute-attention needs a GPT model (the MLP has no attention)"),
             (lambda c: c.sequence_parallel, "--sequence-parallel needs a GPT model (the MLP has no sequence axis)"),
             (lambda c: c.data != "synthetic", "--model mlp trains on its synthetic regression task only "
                                               "(--data synthetic)"),
             (lambda c: c.documents or c.window or c.synthetic_doc_len, "--documents, --window and "
              "--synthetic-doc-len need a GPT model (the MLP has no sequence)"),
             (lambda c: c.mtp, "--mtp needs a GPT model (the MLP predicts no tokens)"),
             (lambda c: c.qk_clip, "--qk-clip needs a GPT model (the MLP has no attention)"),
             (lambda c: c.memory_budget, "--memory-budget needs a GPT model (the planner's memory formula knows "
                                         "no MLP)"))

    def dims(self, cfg):
        base = MLPConfig()
        hidden = cfg.hidden or base.d_model
        return MLPConfig(d_in=base.d_in, d_model=hidden, d_ff=cfg.ffn or 2 * hidden,
                         n_layer=cfg.layers or base.n_layer, d_out=base.d_out)

    def check(self, cfg, mcfg):
        check_divisible(mcfg, cfg.tp, cfg.sequence_parallel)

    def data(self, cfg, mcfg):
        return Regression(mcfg.d_in, mcfg.d_out, cfg.seed)

    def with_vocab(self, cfg, mcfg, data):
        return mcfg

    def ties_ends(self, mcfg):
        return False

    def activation(self, cfg, mcfg, micro):
        return micro, mcfg.d_model

    def terms(self, mcfg):
        """A loss term per output, one sample a "token"."""
        return mcfg.d_out, 1

    def step_flops(self, mcfg, cfg, tokens, span=None):
        return mlp_step_flops(mcfg, cfg.batch_size)

    def shape(self, mcfg):
        return None


MODELS = {**{name: LanguageModel() for name in PRESETS}, "mlp": DeepMLP()}


def kind_of(cfg):
    """The kind of model ``cfg.model`` is."""
    return MODELS[cfg.model]


def refuse_lacking(cfg):
    """The options the run's kind of model has nothing for, refused in one line (config's model group)."""
    for given, line in kind_of(cfg).lacks:
        if given(cfg):
            raise UsageError(line)


def model_config(cfg):
    """The model's dimensions from the options, checked against the layout (its vocabulary: ``setup``)."""
    kind = kind_of(cfg)
    mcfg = kind.dims(cfg)
    stages = cfg.pp * cfg.chunks
    if mcfg.n_layer < stages:
        raise UsageError(f"{mcfg.n_layer} layers cannot fill pp x chunks = {cfg.pp} x {cfg.chunks} = {stages} stages")
    if KINDS[cfg.schedule].chunked and cfg.partition == "uniform" and mcfg.n_layer % stages:
        raise UsageError(f"{cfg.schedule}: {mcfg.n_layer} layers do not divide into pp x chunks = "
                         f"{cfg.pp} x {cfg.chunks} = {stages} equal chunks")
    kind.check(cfg, mcfg)
    if cfg.precision in precision.FP8:                  # no scaling block may straddle two ranks
        refused = fp8_refusal(recipe_of(cfg), mcfg, cfg.tp, cfg.cp, cfg.documents)
        if refused:
            raise UsageError(refused)
    return mcfg


def validation_data(cfg, mcfg):
    """The val.bin beside the training tokens, for --eval-every; refused when there is none."""
    if not cfg.eval_every:
        return None
    val = validation_file(cfg.data) if cfg.data != "synthetic" else None
    if val is None:
        raise UsageError(f"--eval-every needs a val.bin beside the training tokens (hpcpar data prepare writes "
                         f"one); --data {cfg.data} has none")
    return TokenFile(val, mcfg.seq_len, cfg.batch_size, cfg.seed, "random", cfg.token_dtype)


def setup(cfg):
    """The model, its data and its validation data for a checked ``cfg`` (config.checked's last stage):
    every refusal the files and the model's dimensions give, and the --memory-budget against them."""
    kind = kind_of(cfg)
    mcfg = model_config(cfg)
    partition(mcfg.n_layer, cfg.pp * cfg.chunks, cfg.partition, mcfg)    # a --partition that cannot cut
    data = kind.data(cfg, mcfg)
    val_data = validation_data(cfg, mcfg)
    mcfg = kind.with_vocab(cfg, mcfg, data)
    check_budget(cfg, mcfg)
    check_micro_batch(cfg, mcfg)
    check_export_tokenizer(cfg, mcfg)
    return Setup(mcfg, data, val_data)


def check_export_tokenizer(cfg, mcfg):
    """--export copies the data's tokenizer.json beside the weights, for ``hpcpar generate``: one that
    cannot load or is another model's is refused before step 1, not found after the run.  Without the
    tokenizers library nothing here can read it, and it is copied as it is."""
    path = tokenizer_of(cfg.data) if cfg.export else None       # what loop.py's export copies
    if path is not None and importlib.util.find_spec("tokenizers") is not None:
        model_tokenizer(path, mcfg.vocab_size, f"--export {cfg.export}")


def micro_batch(cfg):
    """Sequences per micro-batch: the global batch over the dp replicas, then over --microbatches."""
    return cfg.batch_size // (cfg.dp * cfg.microbatches)


def check_micro_batch(cfg, mcfg):
    """Refuse, before step 1 starts making its data, a micro-batch whose activations could not fit in
    this machine's memory however the engine kept them.  The count is a floor, so it never refuses a
    run that fits: every layer keeps at least its input (the activation two stages pass), a rank holds
    at least ceil(layers / pp) layers, and a number takes the compute dtype's bytes (precision.py),
    at least 1 under an FP8 recipe.  The machine's physical memory is above any job's share of it (a
    Slurm cgroup's), so no rank refuses what another would run.  Host memory only: with --backend cupy
    the activations live on the GPU."""
    if cfg.backend != "numpy":
        return
    shape = kind_of(cfg).activation(cfg, mcfg, micro_batch(cfg))
    layers = math.ceil(mcfg.n_layer / cfg.pp)
    number = 1 if cfg.precision in precision.FP8 else precision.compute_dtype(cfg.precision, np, cfg.dtype).itemsize
    floor = layers * math.prod(shape) * number
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if floor > memory:
        numbers = " x ".join(f"{n:,}" for n in shape)
        raise UsageError(f"--batch-size {cfg.batch_size}: one micro-batch's activations need at least "
                         f"{floor / 2 ** 30:,.0f} GiB on a rank ({layers} layers x {numbers} numbers of "
                         f"{number} bytes, each layer's input alone), more than this machine's "
                         f"{memory / 2 ** 30:.0f} GiB; give a smaller --batch-size or more --microbatches")
