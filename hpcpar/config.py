"""The training run's configuration: one table of options that makes the command-line flags, the TOML
keys (``--config run.toml``; flags override the file) and the checks.

Every check here uses the options and the world size only, so a bad configuration is refused with
the same one-line message on every rank, before any rank communicates (hpcpar/runtime.py).
"""
from dataclasses import dataclass, field, fields
from pathlib import Path

from hpcpar.pipeline.choice import file_chunks, schedule_for
from hpcpar.pipeline.schedules import KINDS, SCHEDULES
from hpcpar.runtime import UsageError


def opt(default, help, choices=None, group="run"):
    return field(default=default, metadata={"help": help, "choices": choices, "group": group})


@dataclass
class TrainConfig:
    # --- layout -----------------------------------------------------------------------------
    tp: int = opt(1, "tensor-parallel size: ranks that share every layer's GEMMs", group="layout")
    cp: int = opt(1, "context-parallel size: ranks that share every sequence (ring attention)", group="layout")
    pp: int = opt(1, "pipeline-parallel size: stages of consecutive layers", group="layout")
    ep: int = opt(1, "expert-parallel size: consecutive ranks of dp x cp that share the experts of every MoE "
                     "layer, tokens sent to them by all-to-all (docs/moe.md)", group="layout")
    dp: int = opt(0, "data-parallel size: model replicas (0: world size / (tp x cp x pp))", group="layout")
    order: str = opt("tp-dp-pp", "rank order, fastest-varying axis first", group="layout")
    schedule: str = opt("1f1b", "pipeline schedule", list(SCHEDULES), "layout")
    microbatches: int = opt(0, "micro-batches per step and DP rank (0: pp)", group="layout")
    chunks: int = opt(0, "model chunks per rank for the interleaved schedule (0: 2 if interleaved, else 1)",
                      group="layout")
    schedule_file: str = opt("", "run the schedule in this CSV file (torch.distributed.pipelining's action "
                                 "format, `hpcpar schedule --export`) instead of --schedule", group="layout")
    partition: str = opt("uniform", "blocks per stage: uniform, params, flops or a list like 3,3,2", group="layout")
    sequence_parallel: bool = opt(False, "shard LayerNorm/dropout activations along the sequence over TP",
                                  group="layout")
    recompute: bool = opt(False, "drop each block's activations after forward and recompute them in backward",
                          group="layout")
    recompute_attention: bool = opt(False, "selective recomputation: keep attention's q, k, v but not its (B, NH, "
                                           "T, T) probabilities, recompute them in backward", group="layout")
    zero: int = opt(0, "ZeRO stage over DP x CP: 1 shards the optimizer state, 2 also the gradients, 3 also the "
                       "parameters (FSDP: each unit gathered before use, docs/zero.md)", group="layout")
    zero1: bool = opt(False, "the same as --zero 1", group="layout")
    reshard_after_forward: bool = opt(True, "--zero 3: free each unit's gathered parameters after its forward "
                                            "(gather again for the backward); off: keep them until its last "
                                            "backward of the step", group="layout")
    fsdp_blocks: int = opt(1, "--zero 3: blocks per unit (gathered and freed together)", group="layout")
    memory_budget: float = opt(0.0, "refuse to start when a rank would hold more than this many GB of parameters, "
                                    "gradients, optimizer state and gathered units (0: no limit)", group="layout")
    bucket_mb: float = opt(4.0, "data-parallel gradient bucket size in MB", group="layout")
    # --- model ------------------------------------------------------------------------------
    model: str = opt("tiny", "model preset (GPT-2 blocks, or llama-*: RMSNorm, RoPE, SwiGLU, grouped-query "
                             "attention; moe-tiny, mixtral-tiny: the same with mixtures of experts)",
                     ["tiny", "small", "gpt2", "llama-tiny", "llama-small", "moe-tiny", "mixtral-tiny", "mlp"],
                     "model")
    layers: int = opt(0, "number of blocks (0: preset)", group="model")
    hidden: int = opt(0, "model width d_model (0: preset)", group="model")
    heads: int = opt(0, "attention heads (0: preset)", group="model")
    rope_theta: float = opt(0.0, "base of the rotary position frequencies (0: 10000, or that of --init-from; "
                                 "llama-*)", group="model")
    kv_heads: int = opt(0, "key/value heads of grouped-query attention, dividing --heads (0: the preset's, "
                           "or --heads when that is given; llama-*)", group="model")
    ffn: int = opt(0, "feed-forward width (0: 4 x hidden)", group="model")
    seq_len: int = opt(0, "training sequence length (0: preset, or the positions of --init-from)", group="model")
    positions: int = opt(0, "rows of the position table, the longest sequence the model reads (0: --seq-len)",
                         group="model")
    vocab: int = opt(0, "vocabulary size (0: the data's)", group="model")
    dropout: float = opt(0.0, "dropout probability", group="model")
    untied: bool = opt(False, "separate output projection instead of the tied token embedding", group="model")
    ln_eps: float = opt(0.0, "LayerNorm epsilon (0: 1e-5, or that of --init-from)", group="model")
    experts: int = opt(0, "routed experts per block, a mixture of experts in place of the MLP (0: the "
                          "preset's; docs/moe.md)", group="model")
    top_k: int = opt(0, "experts per token (0: the preset's, 2)", group="model")
    shared_experts: int = opt(0, "experts every token goes through besides its top-k", group="model")
    router_score: str = opt("softmax", "router scores: softmax (Mixtral, Qwen) or sigmoid (DeepSeek-V3)",
                            ["softmax", "sigmoid"], "model")
    aux_loss_coef: float = opt(0.0, "coefficient of the load-balancing loss (Switch/Mixtral form, per layer)",
                               group="model")
    capacity_factor: float = opt(0.0, "rows an expert takes, as a multiple of an even share N k / E; the rest "
                                      "are dropped and counted (0: dropless, exact)", group="model")
    bias_rate: float = opt(0.0, "DeepSeek-V3's auxiliary-loss-free balancing: step of the routing bias per "
                                "optimizer step (0: off)", group="model")
    # --- data -------------------------------------------------------------------------------
    data: str = opt("synthetic", "synthetic, or a path: a text file (characters), a .bin token file, or a "
                                 "directory from `hpcpar data prepare` (train.bin, val.bin, tokenizer)", group="data")
    data_order: str = opt("random", "random windows, or sequential ones from the start of the file",
                          ["random", "sequential"], "data")
    token_dtype: str = opt("uint16", "dtype of a .bin token file", ["uint16", "uint32"], "data")
    synthetic_vocab: int = opt(32, "synthetic language: vocabulary", group="data")
    synthetic_order: int = opt(2, "synthetic language: Markov order (tokens of context)", group="data")
    synthetic_branching: int = opt(4, "synthetic language: possible next tokens per context", group="data")
    batch_size: int = opt(32, "global batch: sequences per step, over all DP ranks", group="data")
    eval_every: int = opt(0, "validation loss on val.bin (beside the training tokens) every K steps (0: never)",
                          group="data")
    eval_batches: int = opt(4, "batches of --batch-size sequences in each validation", group="data")
    # --- optimisation -----------------------------------------------------------------------
    steps: int = opt(100, "optimizer steps", group="optim")
    optimizer: str = opt("adamw", "optimizer", ["adamw", "sgd"], "optim")
    lr: float = opt(0.0, "peak learning rate (0: the model preset's: tiny 1e-2, small 3e-3, gpt2 6e-4, "
                         "mlp 1e-2)", group="optim")
    min_lr: float = opt(-1.0, "final learning rate of the cosine decay (-1: lr / 10)", group="optim")
    warmup: int = opt(10, "linear warm-up steps", group="optim")
    momentum: float = opt(0.9, "SGD momentum", group="optim")
    beta1: float = opt(0.9, "AdamW beta1", group="optim")
    beta2: float = opt(0.95, "AdamW beta2", group="optim")
    eps: float = opt(1e-8, "AdamW epsilon", group="optim")
    weight_decay: float = opt(0.1, "decoupled weight decay (matrices and embeddings only)", group="optim")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0 disables)", group="optim")
    nonfinite: str = opt("stop", "on a NaN/inf loss: stop (after saving the last good step) or skip the step",
                         ["stop", "skip"], "optim")
    # --- numerics and backend ---------------------------------------------------------------
    dtype: str = opt("float32", "parameter and activation dtype", ["float32", "float64"], "run")
    precision: str = opt("fp32", "fp16/bf16: activations and GEMMs in that dtype, fp32 master weights and "
                         "gradients (fp16 with dynamic loss scaling)", ["fp32", "fp16", "bf16"], "run")
    tf32: bool = opt(False, "GPU, fp32: let cuBLAS multiply float32 matrices on TF32 tensor cores", group="run")
    seed: int = opt(0, "seed of the initialisation, the data order and dropout", group="run")
    backend: str = opt("", "array backend: numpy or cupy (default: $HPCPAR_BACKEND, else numpy)", group="run")
    # --- files and output -------------------------------------------------------------------
    init_from: str = opt("", "start from GPT-2 weights: a safetensors file or a Hugging Face save_pretrained "
                             "directory (the model's dimensions come from it)", group="files")
    export: str = opt("", "write the final weights: FILE.safetensors, or a directory Hugging Face's "
                          "GPT2LMHeadModel.from_pretrained loads", group="files")
    save: str = opt("", "checkpoint directory", group="files")
    save_every: int = opt(0, "checkpoint every K steps (0: only at the end and on preemption)", group="files")
    keep: int = opt(3, "checkpoints to keep", group="files")
    resume: str = opt("", "resume from the latest complete checkpoint in this directory", group="files")
    metrics: str = opt("", "write one JSON object per step to this file", group="files")
    trace: str = opt("", "write a Chrome/Perfetto trace of every rank to this file", group="files")
    trace_steps: int = opt(10, "steps to trace, from the second step on", group="files")
    profile: bool = opt(False, "print where the steps' time went, by category (GEMM, attention, element-wise, "
                               "communication per axis, ...), and the GEMM floor (from the second step on)",
                        group="files")
    summary_json: str = opt("", "write the end-of-run figures (loss, tokens/s, MFU, bubble, bytes) as JSON",
                            group="files")
    log_every: int = opt(0, "print a loss line every K steps (0: about 10 lines per run)", group="files")
    progress: bool = opt(True, "show a progress bar on rank 0", group="files")
    # --- hangs and shutdown (hpcpar/watchdog.py) --------------------------------------------
    hang_timeout: float = opt(300.0, "end the job when a rank makes no progress for this long (seconds, at "
                                     "least 3 x the slowest step; 0 disables)", group="watch")
    shutdown_timeout: float = opt(20.0, "after SIGTERM/SIGUSR1, end the job if the checkpoint and exit take "
                                        "longer (seconds; 0 disables)", group="watch")


PRESET_LR = {"tiny": 1e-2, "small": 3e-3, "gpt2": 6e-4, "llama-tiny": 1e-2, "llama-small": 3e-3, "moe-tiny": 1e-2,
             "mixtral-tiny": 1e-2, "mlp": 1e-2}

GROUPS = {"layout": "parallel layout", "model": "model", "data": "data", "optim": "optimisation",
          "run": "numerics and backend", "files": "files and output", "watch": "hangs and shutdown"}


def defaults():
    return TrainConfig()


def load_toml(path):
    """Options from a TOML file (keys as the flags, with - or _), checked against the known options."""
    try:
        import tomllib
    except ImportError:                      # Python 3.10: the same parser, from PyPI
        import tomli as tomllib
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"config file {path} not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise UsageError(f"cannot read config file {path}: {err}") from None
    known = {f.name: f for f in fields(TrainConfig)}
    out = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in known:
            raise UsageError(f"{path}: unknown option {key!r}")
        want = type(known[name].default)
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise UsageError(f"{path}: option {key!r} must be {want.__name__}, got {value!r}")
        out[name] = value
    return out


def config_from(args):
    """Defaults, then the TOML file (``args.config``), then the flags given on the command line: an
    argparse namespace holds only the flags the user gave (the CLI's defaults are SUPPRESS)."""
    values = load_toml(args.config) if args.config else {}
    values.update({f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)})
    return TrainConfig(**values)


def check(cfg, world):
    """Refuse a configuration that cannot run, with one line naming the numbers. Returns cfg with the
    derived values (dp, microbatches, chunks, min_lr) filled in."""
    from hpcpar.grid import GridLayout
    for f in fields(TrainConfig):
        choices = f.metadata["choices"]
        if choices and getattr(cfg, f.name) not in choices:
            raise UsageError(f"--{f.name.replace('_', '-')} must be one of {', '.join(choices)}, "
                             f"not {getattr(cfg, f.name)!r}")
    for name in ("tp", "cp", "pp", "ep", "batch_size", "synthetic_vocab", "synthetic_order", "synthetic_branching", "keep",
                 "eval_batches"):
        if getattr(cfg, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
    for name in ("dp", "microbatches", "chunks", "layers", "hidden", "heads", "kv_heads", "ffn", "seq_len",
                 "positions", "vocab", "steps", "warmup", "save_every", "log_every", "seed", "trace_steps",
                 "eval_every", "ln_eps", "rope_theta", "experts", "top_k", "shared_experts", "aux_loss_coef",
                 "capacity_factor", "bias_rate"):
        if getattr(cfg, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must not be negative, got {getattr(cfg, name)}")
    if not cfg.backend:
        import os
        cfg.backend = os.environ.get("HPCPAR_BACKEND", "numpy")
    if cfg.backend not in ("numpy", "cupy"):
        raise UsageError(f"--backend must be numpy or cupy, not {cfg.backend!r}")
    if cfg.precision != "fp32" and cfg.dtype != "float32":
        raise UsageError(f"--precision {cfg.precision} keeps float32 master weights: use --dtype float32")
    if cfg.tf32 and (cfg.backend != "cupy" or cfg.precision != "fp32" or cfg.dtype != "float32"):
        raise UsageError("--tf32 applies to float32 GEMMs on a GPU only: it needs --backend cupy, "
                         "--dtype float32 and --precision fp32")
    if cfg.lr == 0:
        cfg.lr = PRESET_LR[cfg.model]
    for name in ("lr", "eps", "bucket_mb"):
        if not getattr(cfg, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}")
    for name in ("weight_decay", "grad_clip", "hang_timeout", "shutdown_timeout"):
        if getattr(cfg, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must not be negative, got {getattr(cfg, name)}")
    for name in ("dropout", "momentum", "beta1", "beta2"):
        if not 0 <= getattr(cfg, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(cfg, name)}")
    if cfg.dp == 0:
        model_parallel = cfg.tp * cfg.cp * cfg.pp
        if world % model_parallel:
            names, sizes = ("tp x pp", f"{cfg.tp} x {cfg.pp}") if cfg.cp == 1 else \
                ("tp x cp x pp", f"{cfg.tp} x {cfg.cp} x {cfg.pp}")
            raise UsageError(f"{names} = {sizes} = {model_parallel} does not divide the world size {world}")
        cfg.dp = world // model_parallel
    GridLayout(world, cfg.order, tp=cfg.tp, pp=cfg.pp, dp=cfg.dp, cp=cfg.cp)        # world mismatch, bad order
    from_file = file_chunks(cfg)                                         # 0 without --schedule-file
    chunked = from_file > 1 if from_file else KINDS[cfg.schedule].chunked
    if cfg.chunks == 0:
        cfg.chunks = from_file or (2 if chunked else 1)
    if chunked and cfg.chunks < 2:
        raise UsageError(f"the {cfg.schedule} schedule needs --chunks >= 2")
    if not chunked and cfg.chunks != 1:
        raise UsageError(f"--chunks {cfg.chunks} needs --schedule "
                         + " or ".join(name for name, kind in KINDS.items() if kind.chunked))
    if cfg.microbatches == 0:
        cfg.microbatches = cfg.pp
    schedule_for(cfg)                                                     # a hang refused before launch
    if cfg.batch_size % (cfg.dp * cfg.microbatches):
        raise UsageError(f"--batch-size {cfg.batch_size} must divide into dp x microbatches = {cfg.dp} x "
                         f"{cfg.microbatches} = {cfg.dp * cfg.microbatches} equal micro-batches")
    if cfg.min_lr < 0:
        cfg.min_lr = cfg.lr / 10
    if cfg.data != "synthetic" and not Path(cfg.data).is_file() and not Path(cfg.data, "train.bin").is_file():
        raise UsageError(f"data file {cfg.data} not found")
    if cfg.init_from:
        if not Path(cfg.init_from).exists():
            raise UsageError(f"--init-from: {cfg.init_from} not found")
        from hpcpar.checkpoint.hf import adopt
        adopt(cfg)                                  # the file's dimensions, or one line on a contradiction
    if cfg.recompute and cfg.recompute_attention:
        raise UsageError("--recompute already recomputes the attention: give it or --recompute-attention, not both")
    if cfg.cp > 1:
        if cfg.model == "mlp":
            raise UsageError("--cp needs a GPT model (the MLP has no sequence to share)")
        if cfg.dropout:
            raise UsageError(f"--cp {cfg.cp}: ring attention has no dropout on the attention probabilities; "
                             f"use --dropout 0")
        if cfg.precision != "fp32":
            raise UsageError(f"--cp {cfg.cp}: ring attention computes in the parameters' dtype; use --precision fp32")
    check_zero(cfg)
    if cfg.model == "mlp":
        if cfg.recompute_attention:
            raise UsageError("--recompute-attention needs a GPT model (the MLP has no attention)")
        if cfg.sequence_parallel:
            raise UsageError("--sequence-parallel needs a GPT model (the MLP has no sequence axis)")
        if cfg.data != "synthetic":
            raise UsageError("--model mlp trains on its synthetic regression task only (--data synthetic)")
    return cfg


def check_zero(cfg):
    """The ZeRO options (stage, units, budget) against the layout; sets cfg.zero from the --zero1 alias."""
    if cfg.zero1:
        if cfg.zero not in (0, 1):
            raise UsageError(f"--zero1 is --zero 1: it contradicts --zero {cfg.zero}")
        cfg.zero = 1
    if cfg.zero not in (0, 1, 2, 3):
        raise UsageError(f"--zero must be 0, 1, 2 or 3, not {cfg.zero}")
    group = cfg.dp * cfg.cp
    if cfg.zero >= 2 and group == 1:
        raise UsageError(f"--zero {cfg.zero} shards over dp x cp = {cfg.dp} x {cfg.cp} = 1 rank: there is nothing "
                         f"to shard; use --zero 0 (or more ranks: --dp)")
    if cfg.fsdp_blocks < 1:
        raise UsageError(f"--fsdp-blocks must be at least 1, got {cfg.fsdp_blocks}")
    if cfg.zero != 3 and (cfg.fsdp_blocks != 1 or not cfg.reshard_after_forward):
        raise UsageError("--fsdp-blocks and --no-reshard-after-forward shape ZeRO-3's units: they need --zero 3")
    if cfg.memory_budget < 0:
        raise UsageError(f"--memory-budget must not be negative, got {cfg.memory_budget}")
    if cfg.memory_budget and cfg.model == "mlp":
        raise UsageError("--memory-budget needs a GPT model (the planner's memory formula knows no MLP)")
