"""The training run's options: one table that makes the command-line flags (cli/train.py), the TOML keys
(``--config run.toml``; flags override the file) and the checks (config.py).

Each option is a field of ``TrainConfig`` made by ``opt``: its default, its help line, its choices or
bound, and its group - the --help section, and the function of config.GROUP_CHECKS that holds the rules
between it and the others.  A new option is one field here and, if it constrains others, a line in its
group's check.
"""
from dataclasses import dataclass, field, fields
from pathlib import Path

from hpcpar.pipeline.schedules import SCHEDULES
from hpcpar.precision import PRECISIONS
from hpcpar.runtime import UsageError
from hpcpar.training.models import MODELS


# what ``bound`` accepts: the test, and the end of the message when it fails
BOUNDS = {"count": (lambda v: v >= 1, "must be at least 1"), "natural": (lambda v: v >= 0, "must not be negative"),
          "positive": (lambda v: v > 0, "must be positive"), "fraction": (lambda v: 0 <= v < 1, "must be in [0, 1)")}


def opt(default, help, choices=None, group="run", bound=None):
    """An option: its default, its help line, the values it may take (``choices``, or a ``bound`` of
    BOUNDS), and its ``group`` of GROUPS (the --help section and the function of GROUP_CHECKS)."""
    return field(default=default, metadata={"help": help, "choices": choices, "group": group, "bound": bound})


@dataclass
class TrainConfig:
    # --- layout -----------------------------------------------------------------------------
    tp: int = opt(1, "tensor-parallel size: ranks that share every layer's GEMMs", group="layout", bound="count")
    cp: int = opt(1, "context-parallel size: ranks that share every sequence (ring attention)",
                  group="layout", bound="count")
    cp_kind: str = opt("ring", "context parallelism's attention: ring (K/V blocks travel round the cp ranks) or "
                               "ulysses (two all-to-alls trade the sequence cut for a head cut; heads and K/V "
                               "heads per tp rank must divide by cp)", ["ring", "ulysses"], "layout")
    pp: int = opt(1, "pipeline-parallel size: stages of consecutive layers", group="layout", bound="count")
    ep: int = opt(1, "expert-parallel size: consecutive ranks of dp x cp that share the experts of every MoE "
                     "layer, tokens sent to them by all-to-all (docs/moe.md)", group="layout", bound="count")
    dp: int = opt(0, "data-parallel size: model replicas (0: world size / (tp x cp x pp))",
                  group="layout", bound="natural")
    order: str = opt("tp-dp-pp", "rank order, fastest-varying axis first", group="layout")
    schedule: str = opt("1f1b", "pipeline schedule", list(SCHEDULES), "layout")
    microbatches: int = opt(0, "micro-batches per step and DP rank (0: pp)", group="layout", bound="natural")
    chunks: int = opt(0, "model chunks per rank for the interleaved schedule (0: 2 if interleaved, else 1)",
                      group="layout", bound="natural")
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
    fsdp_blocks: int = opt(1, "--zero 3: blocks per unit (gathered and freed together)", group="layout",
                           bound="count")
    dp_shard: int = opt(0, "HSDP: ZeRO cuts its state over groups of N data-parallel ranks (x cp) and replicates "
                           "it across the groups - reduce-scatter and gather inside a group, all-reduce across "
                           "(0: over all of dp x cp; docs/zero.md)", group="layout", bound="natural")
    whole_tensors: bool = opt(False, "ZeRO: each parameter lives whole on one rank of its group, balanced by size, "
                                     "instead of equal ranges of the flat buffers", group="layout")
    memory_budget: float = opt(0.0, "refuse to start when a rank would hold more than this many GB of parameters, "
                                    "gradients, optimizer state and gathered units (0: no limit)", group="layout",
                               bound="natural")
    bucket_mb: float = opt(4.0, "data-parallel gradient bucket size in MB", group="layout", bound="positive")
    # --- model ------------------------------------------------------------------------------
    model: str = opt("", "model preset (GPT-2 blocks, or llama-*: RMSNorm, RoPE, SwiGLU, grouped-query "
                         "attention; moe-tiny, mixtral-tiny: the same with mixtures of experts; qwen3-moe-tiny: "
                         "mixtral-tiny with QK-norm; deepseek-tiny: DeepSeek-V3's latent attention and experts; "
                         "'': tiny, or the family of --init-from)",
                     list(MODELS), "model")
    layers: int = opt(0, "number of blocks (0: preset)", group="model", bound="natural")
    hidden: int = opt(0, "model width d_model (0: preset)", group="model", bound="natural")
    heads: int = opt(0, "attention heads (0: preset)", group="model", bound="natural")
    rope_theta: float = opt(0.0, "base of the rotary position frequencies (0: 10000, or that of --init-from; "
                                 "llama-*)", group="model", bound="natural")
    kv_heads: int = opt(0, "key/value heads of grouped-query attention, dividing --heads (0: the preset's, "
                           "or --heads when that is given; llama-*)", group="model", bound="natural")
    head_dim: int = opt(0, "features per attention head (0: hidden / heads, or that of --init-from; llama-*, "
                           "qwen3-moe-tiny)", group="model", bound="natural")
    ffn: int = opt(0, "feed-forward width (0: 4 x hidden)", group="model", bound="natural")
    seq_len: int = opt(0, "training sequence length (0: preset, or the positions of --init-from)",
                       group="model", bound="natural")
    positions: int = opt(0, "rows of the position table, the longest sequence the model reads (0: --seq-len)",
                         group="model", bound="natural")
    vocab: int = opt(0, "vocabulary size (0: the data's)", group="model", bound="natural")
    dropout: float = opt(0.0, "dropout probability", group="model", bound="fraction")
    untied: bool = opt(False, "separate output projection instead of the tied token embedding", group="model")
    ln_eps: float = opt(0.0, "LayerNorm epsilon (0: 1e-5, or that of --init-from)", group="model", bound="natural")
    experts: int = opt(0, "routed experts per block, a mixture of experts in place of the MLP (0: the "
                          "preset's; docs/moe.md)", group="model", bound="natural")
    top_k: int = opt(0, "experts per token (0: the preset's, 2)", group="model", bound="natural")
    shared_experts: int = opt(0, "experts every token goes through besides its top-k", group="model",
                              bound="natural")
    norm_topk: bool = opt(True, "renormalise each token's k chosen scores to sum to 1 (Mixtral; Qwen3-MoE's "
                                "norm_topk_prob, or that of --init-from)", group="model")
    router_score: str = opt("softmax", "router scores: softmax (Mixtral, Qwen) or sigmoid (DeepSeek-V3)",
                            ["softmax", "sigmoid"], "model")
    aux_loss_coef: float = opt(0.0, "coefficient of the load-balancing loss (Switch/Mixtral form, per layer)",
                               group="model", bound="natural")
    capacity_factor: float = opt(0.0, "rows an expert takes, as a multiple of an even share N k / E, positive; the "
                                      "rest are dropped and counted (without the flag: dropless, exact)",
                                 group="model", bound="natural")
    bias_rate: float = opt(0.0, "DeepSeek-V3's auxiliary-loss-free balancing: step of the routing bias per "
                                "optimizer step (0: off)", group="model", bound="natural")
    window: int = opt(0, "sliding-window attention: each query sees at most this many keys, itself included "
                         "(0: every earlier key; Mistral, Qwen, gpt-oss)", group="model", bound="natural")
    window_layers: str = opt("", "the layers --window applies to: a slice like ::2 (every other layer, as "
                                 "gpt-oss) or 4: (from layer 4 on, as Qwen), or a list like 0,2,5 ('': all)",
                             group="model")
    dims: str = opt("", "more of the model's sizes as name=value pairs: DeepSeek's q_lora_rank, kv_lora_rank, "
                        "qk_rope_dim, v_head_dim, rope_interleave, first_dense, d_ff_dense, n_group, topk_group, "
                        "routed_scale and yarn_* (nn/dims.py; '': the preset's, or those of --init-from)",
                    group="model")
    mtp: int = opt(0, "multi-token prediction: D modules on the last stage, module k predicting the token k + 1 "
                      "after the next through the shared embedding and head (DeepSeek-V3; 0: none, or those of "
                      "--init-from; docs/deepseek.md)", group="model", bound="natural")
    mtp_lambda: float = opt(0.3, "the weight of the MTP modules' mean loss in the loss trained on", group="model",
                            bound="natural")
    # --- data -------------------------------------------------------------------------------
    data: str = opt("synthetic", "synthetic, or a path: a text file (characters), a .bin token file, or a "
                                 "directory from `hpcpar data prepare` (train.bin, val.bin, tokenizer)", group="data")
    data_order: str = opt("random", "random windows, or sequential ones from the start of the file",
                          ["random", "sequential"], "data")
    token_dtype: str = opt("uint16", "dtype of a .bin token file", ["uint16", "uint32"], "data")
    synthetic_vocab: int = opt(32, "synthetic language: vocabulary", group="data", bound="count")
    synthetic_order: int = opt(2, "synthetic language: Markov order (tokens of context)", group="data", bound="count")
    synthetic_branching: int = opt(4, "synthetic language: possible next tokens per context",
                                   group="data", bound="count")
    synthetic_doc_len: int = opt(0, "synthetic language: documents of 1 .. 2L-1 tokens, L on average, each "
                                    "begun afresh (0: one endless document)", group="data", bound="natural")
    documents: bool = opt(False, "attention within each document of a window only (block-diagonal causal "
                                 "masks), positions restarting at each document, the target that crosses "
                                 "into the next one left out of the loss (docs/own_data.md)", group="data")
    boundary_targets: bool = opt(False, "--documents: keep in the loss the target that crosses into the next "
                                        "document (Megatron without --eod-mask-loss)", group="data")
    batch_size: int = opt(32, "global batch: sequences per step, over all DP ranks", group="data", bound="count")
    eval_every: int = opt(0, "validation loss on val.bin (beside the training tokens) every K steps (0: never)",
                          group="data", bound="natural")
    eval_batches: int = opt(4, "batches of --batch-size sequences in each validation", group="data", bound="count")
    # --- optimisation -----------------------------------------------------------------------
    steps: int = opt(100, "optimizer steps", group="optim", bound="natural")
    optimizer: str = opt("adamw", "optimizer (muon: Muon for the blocks' weight matrices, AdamW for the rest, "
                                  "docs/optimizers.md)", ["adamw", "sgd", "muon"], "optim")
    lr: float = opt(0.0, "peak learning rate (0: the model preset's: tiny 1e-2, small 3e-3, gpt2 6e-4, "
                         "mlp 1e-2)", group="optim", bound="positive")
    min_lr: float = opt(-1.0, "final learning rate of the cosine decay (-1: lr / 10)", group="optim")
    warmup: int = opt(10, "linear warm-up steps", group="optim", bound="natural")
    momentum: float = opt(-1.0, "SGD's momentum (-1: 0.9); Muon's Nesterov momentum (-1: 0.95)", group="optim")
    nesterov: bool = opt(True, "Muon: Nesterov momentum (off: the plain momentum buffer)", group="optim")
    ns_steps: int = opt(5, "Muon: Newton-Schulz iterations (quintic, coefficients 3.4445, -4.7750, 2.0315)",
                        group="optim", bound="count")
    ns_bf16: bool = opt(False, "Muon: run the Newton-Schulz iterations in bf16, as PyTorch does (default: in the "
                               "master weights' dtype)", group="optim")
    muon_scale: str = opt("moonlight", "Muon's update scale: moonlight 0.2 sqrt(max(rows, cols)), AdamW's update "
                                       "RMS, one --lr for both groups; keller sqrt(max(1, rows / cols))",
                          ["moonlight", "keller"], "optim")
    muon_tp: str = opt("duplicated", "Muon under --tp: duplicated (gather each matrix, Newton-Schulz on the whole), "
                                     "distributed (keep the shards, all-reduce the Gram matrix each iteration) - "
                                     "both exact - or blockwise (Newton-Schulz on each shard: another optimizer)",
                       ["duplicated", "distributed", "blockwise"], "optim")
    qk_clip: float = opt(0.0, "QK-clip (MuonClip): after each step, scale W_q and W_k of every head whose largest "
                              "pre-softmax logit S exceeds TAU by (TAU / S)^0.5 each (0: off)", group="optim",
                         bound="natural")
    beta1: float = opt(0.9, "AdamW beta1", group="optim", bound="fraction")
    beta2: float = opt(0.95, "AdamW beta2", group="optim", bound="fraction")
    eps: float = opt(1e-8, "AdamW epsilon", group="optim", bound="positive")
    weight_decay: float = opt(0.1, "decoupled weight decay (matrices and embeddings only)",
                              group="optim", bound="natural")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0 disables)", group="optim", bound="natural")
    nonfinite: str = opt("stop", "on a NaN/inf loss: stop (after saving the last good step) or skip the step",
                         ["stop", "skip"], "optim")
    skip_limit: int = opt(10, "--nonfinite skip: stop as --nonfinite stop does after this many steps skipped in a "
                              "row", group="optim", bound="count")
    # --- numerics and backend ---------------------------------------------------------------
    dtype: str = opt("float32", "parameter and activation dtype", ["float32", "float64"], "run")
    precision: str = opt("fp32", "fp16/bf16: activations and GEMMs in that dtype, fp32 master weights and "
                         "gradients (fp16 with dynamic loss scaling); fp8-tensorwise, fp8-rowwise, fp8-blockwise, "
                         "mxfp8, nvfp4: the blocks' linear-layer GEMM inputs quantised by that recipe, the rest as "
                         "--fp8-rest (docs/precision.md)", list(PRECISIONS), "run")
    fp8_rest: str = opt("fp32", "under an FP8/FP4 --precision, every number outside the quantised GEMMs: fp32 (the "
                                "--dtype, float64 too) or bf16 (with fp32 master weights)", ["fp32", "bf16"], "run")
    fp8_amax_history: int = opt(0, "--precision fp8-tensorwise: delayed scaling, each scale from the largest amax "
                                   "of the last K steps (0: this step's own amax)", group="run", bound="natural")
    fp8_block: int = opt(0, "--precision fp8-blockwise: the edge of its tiles and blocks (0: DeepSeek-V3's 128)",
                         group="run", bound="natural")
    fp8_accumulator_bits: int = opt(0, "FP8/FP4 GEMMs: sum in an accumulator of this many mantissa bits (14: "
                                       "DeepSeek-V3's H800), promoted to fp32 every 128 K-elements under "
                                       "fp8-blockwise (0: fp32)", group="run", bound="natural")
    fp8_param_gather: bool = opt(False, "--zero 3 and --precision fp8-tensorwise: all-gather the quantised layers' "
                                        "weights in FP8, one byte a number (docs/precision.md)", group="layout")
    tf32: bool = opt(False, "GPU, fp32: let cuBLAS multiply float32 matrices on TF32 tensor cores", group="run")
    seed: int = opt(0, "seed of the initialisation, the data order and dropout", group="run", bound="natural")
    backend: str = opt("", "array backend: numpy or cupy (default: $HPCPAR_BACKEND, else numpy)", group="run")
    gemm: str = opt("", "the host's GEMM library: numpy, mkl, onednn or auto (bf16/fp16: the fastest installed "
                        "one with a matrix unit for it, by a probe; fp32: numpy) (default: $HPCPAR_GEMM, else "
                        "auto)", group="run")
    # --- files and output -------------------------------------------------------------------
    init_from: str = opt("", "start from GPT-2, Llama, Mixtral or Qwen3-MoE weights: a safetensors file or a "
                             "Hugging Face save_pretrained directory (the model's family and dimensions come from it)",
                         group="files")
    export: str = opt("", "write the final weights: FILE.safetensors, or a directory Hugging Face's "
                          "GPT2LMHeadModel.from_pretrained loads", group="files")
    save: str = opt("", "checkpoint directory", group="files")
    save_every: int = opt(0, "checkpoint every K steps (0: only at the end and on preemption)",
                          group="files", bound="natural")
    keep: int = opt(3, "checkpoints to keep", group="files", bound="count")
    resume: str = opt("", "resume from the latest complete checkpoint in this directory", group="files")
    metrics: str = opt("", "write one JSON object per step to this file", group="files")
    trace: str = opt("", "write a Chrome/Perfetto trace of every rank to this file", group="files")
    trace_steps: int = opt(10, "steps to trace, from the second step on", group="files", bound="natural")
    profile: bool = opt(False, "print where the steps' time went, by category (GEMM, attention, element-wise, "
                               "communication per axis, ...), and the GEMM floor (from the second step on)",
                        group="files")
    summary_json: str = opt("", "write the end-of-run figures (loss, tokens/s, MFU, bubble, bytes) as JSON",
                            group="files")
    log_every: int = opt(0, "print a loss line every K steps (0: about 10 lines per run)",
                         group="files", bound="natural")
    progress: bool = opt(True, "show a progress bar on rank 0", group="files")
    plug: str = opt("", "run your own functions in place of the engine's (a Python file: tensor-parallel layers, "
                        "1F1B order, ZeRO-1 shard, ring attention, expert dispatch; training/plug.py)", group="files")
    # --- hangs and shutdown (hpcpar/watch/watchdog.py) --------------------------------------------
    hang_timeout: float = opt(300.0, "end the job when a rank makes no progress for this long (seconds, at "
                                     "least 3 x the slowest step; 0 disables)", group="watch", bound="natural")
    shutdown_timeout: float = opt(20.0, "after SIGTERM/SIGUSR1, end the job if the checkpoint and exit take "
                                        "longer (seconds; 0 disables)", group="watch", bound="natural")
    on_failure: str = opt("abort", "when a rank dies: abort (end the job, relaunch from the last checkpoint) or "
                                   "shrink (the survivors go on in the same job: Open MPI 5 with mpiexec --with-ft ulfm; "
                                   "docs/reliability.md)", ["abort", "shrink"], "watch")
    buddy_every: int = opt(0, "--on-failure shrink: copy each rank's state to a rank on another node every K steps, "
                              "for a failure no replica survives (0: never)", group="watch", bound="natural")


GROUPS = {"layout": "parallel layout", "model": "model", "data": "data", "optim": "optimisation",
          "run": "numerics and backend", "files": "files and output", "watch": "hangs and shutdown"}


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
    if not values.get("capacity_factor", 1) > 0:    # given: dropless is the option left out, not a factor
        raise UsageError(f"--capacity-factor must be positive, got {values['capacity_factor']} (dropless routing, "
                         f"every choice computed, is the default: leave the option out)")
    return TrainConfig(**values)
