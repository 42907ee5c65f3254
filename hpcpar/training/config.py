"""The checks of a training run's configuration (its options: options.py).

``check`` runs in three stages.  First ``read_files``: what the ``--init-from`` file says (the model's
family and dimensions) fills in or contradicts the options.  Then ``check_options``: every option's own
choices and bounds (its field's metadata), the derived defaults, and the relations between options, one
function per option group (GROUP_CHECKS); a rule between options is a line in its group's function.
Last the model (models.py's ``setup``): its dimensions against the layout, its data files, its vocabulary
and the state a rank would hold.

Every check uses the options, the files they name and the world size only, so a bad configuration is
refused with the same one-line message on every rank, before any rank communicates (hpcpar/runtime.py).
"""
import math
from dataclasses import fields
from pathlib import Path

from hpcpar.pipeline.choice import file_chunks, schedule_for
from hpcpar.pipeline.schedules import KINDS
from hpcpar.precision import FP8, elsewhere
from hpcpar.runtime import UsageError
from hpcpar.training.models import refuse_lacking, setup
from hpcpar.training.options import BOUNDS, TrainConfig


DEFAULT_MODEL = "tiny"          # --model when neither the flag nor an --init-from file names one
MAX_MICROBATCHES = 2 ** 16      # per step and data-parallel rank: the schedule (built before the first step) stays small
PRESET_LR = {"tiny": 1e-2, "small": 3e-3, "gpt2": 6e-4, "llama-tiny": 1e-2, "llama-small": 3e-3, "moe-tiny": 1e-2,
             "mixtral-tiny": 1e-2, "qwen3-moe-tiny": 1e-2, "deepseek-tiny": 1e-2, "mlp": 1e-2}


def check(cfg, world):
    """Refuse a configuration that cannot run, with one line naming the numbers. Returns cfg with the
    derived values (model, dimensions, dp, microbatches, chunks, lr, min_lr, backend) filled in."""
    return checked(cfg, world)[0]


def checked(cfg, world):
    """``check``'s (cfg, models.Setup): the model, its data and its validation data made on the way,
    which the trainer takes rather than make them twice."""
    cfg = check_options(read_files(cfg), world)
    return cfg, setup(cfg)


def read_files(cfg):
    """What the ``--init-from`` file says: the model's family (unless --model names it) and dimensions,
    or one line on a contradiction (checkpoint/hf.py).  Without one, --model defaults to tiny."""
    if not cfg.init_from:
        cfg.model = cfg.model or DEFAULT_MODEL
        return cfg
    if not Path(cfg.init_from).exists():
        raise UsageError(f"--init-from: {cfg.init_from} not found")
    from hpcpar.checkpoint.hf import adopt
    return adopt(cfg)


def check_options(cfg, world):
    """Each option's choices, the defaults derived from others, each option's bound, then the rules
    between the options of each group."""
    for f in fields(TrainConfig):
        choices = f.metadata["choices"]
        if choices and getattr(cfg, f.name) not in choices:
            raise UsageError(f"{_flag(f.name)} must be one of {', '.join(choices)}, not {getattr(cfg, f.name)!r}")
    for f in fields(TrainConfig):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):     # NaN passes "v <= 0": asked first
            raise UsageError(f"{_flag(f.name)} must be a finite number, got {value}")
    if cfg.lr == 0:
        cfg.lr = PRESET_LR[cfg.model]
    for f in fields(TrainConfig):
        if f.metadata["bound"]:
            holds, must = BOUNDS[f.metadata["bound"]]
            if not holds(getattr(cfg, f.name)):
                raise UsageError(f"{_flag(f.name)} {must}, got {getattr(cfg, f.name)}")
    for group_check in GROUP_CHECKS.values():
        group_check(cfg, world)
    return cfg


def _flag(name):
    return "--" + name.replace("_", "-")


def _check_run(cfg, world):
    if not cfg.backend:
        import os
        cfg.backend = os.environ.get("HPCPAR_BACKEND", "numpy")
    if cfg.backend not in ("numpy", "cupy"):
        raise UsageError(f"--backend must be numpy or cupy, not {cfg.backend!r}")
    if elsewhere(cfg.precision, cfg.fp8_rest) != "fp32" and cfg.dtype != "float32":
        what = "--fp8-rest bf16" if cfg.precision in FP8 else f"--precision {cfg.precision}"
        raise UsageError(f"{what} keeps float32 master weights: use --dtype float32")
    _check_fp8(cfg)
    if cfg.plug and not Path(cfg.plug).is_file():
        raise UsageError(f"--plug: {cfg.plug} not found")
    from hpcpar import blas
    cfg.gemm = blas.requested(cfg.gemm)
    if cfg.gemm != "auto":
        blas.load(cfg.gemm)                     # a name not known, or a library not installed: refused here
    if cfg.tf32 and (cfg.backend != "cupy" or cfg.precision != "fp32" or cfg.dtype != "float32"):
        raise UsageError("--tf32 applies to float32 GEMMs on a GPU only: it needs --backend cupy, "
                         "--dtype float32 and --precision fp32")


def _check_fp8(cfg):
    """The FP8/FP4 options against --precision (the layout's blocks: fp8/layout.py, once the model is known)."""
    given = [name for name in ("fp8_amax_history", "fp8_block", "fp8_accumulator_bits", "fp8_param_gather")
             if getattr(cfg, name)] + (["fp8_rest"] if cfg.fp8_rest != "fp32" else [])
    if cfg.precision not in FP8:
        if given:
            raise UsageError(f"{_flag(given[0])} shapes FP8/FP4 training: it needs --precision " + ", ".join(FP8))
        return
    if cfg.backend == "numpy":
        from hpcpar.fp8.formats import require
        require(f"--precision {cfg.precision}")
    if cfg.fp8_amax_history and cfg.precision != "fp8-tensorwise":
        raise UsageError(f"--fp8-amax-history: delayed scaling keeps one scale per tensor; --precision "
                         f"{cfg.precision} scales smaller pieces from their own amax (use fp8-tensorwise)")
    if cfg.fp8_block and cfg.precision != "fp8-blockwise":
        raise UsageError(f"--fp8-block sets fp8-blockwise's tiles; {cfg.precision}'s blocks are its format's")
    if cfg.fp8_param_gather and (cfg.precision != "fp8-tensorwise" or cfg.zero != 3 or cfg.fp8_amax_history):
        raise UsageError("--fp8-param-gather gathers ZeRO-3's weights with one scale each, known before the "
                         "gather: it needs --zero 3 and --precision fp8-tensorwise (current scaling)")


def _check_layout(cfg, world):
    from hpcpar.comm.grid import GridLayout
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
        cfg.chunks = from_file or KINDS[cfg.schedule].default_chunks
    if chunked and cfg.chunks < 2:
        raise UsageError(f"the {cfg.schedule} schedule needs --chunks >= 2")
    if not chunked and cfg.chunks != 1:
        raise UsageError(f"--chunks {cfg.chunks} needs --schedule "
                         + " or ".join(name for name, kind in KINDS.items() if kind.chunked))
    if cfg.microbatches == 0:
        cfg.microbatches = cfg.pp
    if cfg.microbatches > MAX_MICROBATCHES:             # the schedule is built and checked before step 1
        raise UsageError(f"--microbatches {cfg.microbatches}: a step runs at most {MAX_MICROBATCHES:,} micro-batches "
                         f"per data-parallel rank")
    if cfg.batch_size % (cfg.dp * cfg.microbatches):
        raise UsageError(f"--batch-size {cfg.batch_size} must divide into dp x microbatches = {cfg.dp} x "
                         f"{cfg.microbatches} = {cfg.dp * cfg.microbatches} equal micro-batches")
    if cfg.recompute and cfg.recompute_attention:
        raise UsageError("--recompute already recomputes the attention: give it or --recompute-attention, not both")
    if cfg.cp > 1:
        if cfg.dropout:
            raise UsageError(f"--cp {cfg.cp}: {cfg.cp_kind} attention has no dropout on the attention probabilities; "
                             f"use --dropout 0")
        if elsewhere(cfg.precision, cfg.fp8_rest) != "fp32":
            raise UsageError(f"--cp {cfg.cp}: {cfg.cp_kind} attention computes in the parameters' dtype; "
                             f"use --precision fp32" + (" or --fp8-rest fp32" if cfg.precision in FP8 else ""))
    schedule_for(cfg)                                                     # a hang refused before launch
    check_zero(cfg)


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
    if cfg.zero != 3 and (cfg.fsdp_blocks != 1 or not cfg.reshard_after_forward):
        raise UsageError("--fsdp-blocks and --no-reshard-after-forward shape ZeRO-3's units: they need --zero 3")
    if (cfg.dp_shard or cfg.whole_tensors) and not cfg.zero:
        raise UsageError(f"--{'dp-shard' if cfg.dp_shard else 'whole-tensors'} shapes how ZeRO cuts its state: "
                         f"it needs --zero 1, 2 or 3")
    if cfg.dp_shard:
        shard = cfg.dp_shard * cfg.cp
        if cfg.dp % cfg.dp_shard:
            raise UsageError(f"--dp-shard {cfg.dp_shard} must divide dp = {cfg.dp}: shard groups of equal size")
        if cfg.zero >= 2 and shard == 1:
            raise UsageError(f"--zero {cfg.zero} shards over dp-shard x cp = 1 rank: there is nothing to shard; "
                             f"use --zero 0 (or a larger --dp-shard)")
        if shard % cfg.ep and cfg.ep % shard:
            raise UsageError(f"--dp-shard {cfg.dp_shard} x cp {cfg.cp} = {shard} and --ep {cfg.ep} must divide "
                             f"one another: each shard group holds whole expert groups, or lies inside one")
    if cfg.whole_tensors and cfg.memory_budget:
        raise UsageError("--memory-budget counts equal ranges of the flat buffers; --whole-tensors balances "
                         "whole tensors instead: give one of them")


MUON_OPTIONS = ("nesterov", "ns_steps", "ns_bf16", "muon_scale", "muon_tp")


def _check_optim(cfg, world):
    if cfg.min_lr < 0:
        cfg.min_lr = cfg.lr / 10
    if cfg.min_lr > cfg.lr:
        raise UsageError(f"--min-lr {cfg.min_lr} is above the peak --lr {cfg.lr}: the cosine decays from --lr "
                         f"down to --min-lr")
    if cfg.momentum < 0:
        cfg.momentum = 0.95 if cfg.optimizer == "muon" else 0.9
    if not 0 <= cfg.momentum < 1:
        raise UsageError(f"--momentum must be in [0, 1), got {cfg.momentum}")
    changed = [n for n in MUON_OPTIONS if getattr(cfg, n) != getattr(TrainConfig, n)]
    if cfg.optimizer != "muon" and changed:
        raise UsageError(f"{_flag(changed[0])} sets Muon's update: it needs --optimizer muon")
    if cfg.optimizer == "muon" and cfg.zero:
        if cfg.memory_budget:
            raise UsageError("--memory-budget counts equal ranges of the flat buffers; Muon under ZeRO keeps each "
                             "matrix whole on one rank: give one of them")
        cfg.whole_tensors = True            # Muon needs each matrix whole on its owner (docs/optimizers.md)
    if cfg.qk_clip and cfg.plug:
        raise UsageError("--qk-clip reads the logits the engine's attention records; a --plug file's does not")


def _check_data(cfg, world):
    if cfg.data != "synthetic" and not Path(cfg.data).is_file() and not Path(cfg.data, "train.bin").is_file():
        raise UsageError(f"data file {cfg.data} not found")
    if cfg.boundary_targets and not cfg.documents:
        raise UsageError("--boundary-targets chooses what --documents leaves out of the loss: give --documents too")
    if cfg.synthetic_doc_len and cfg.data != "synthetic":
        raise UsageError(f"--synthetic-doc-len shapes the synthetic language; --data {cfg.data} has its own "
                         f"documents (hpcpar data prepare records them)")


def _check_model(cfg, world):
    refuse_lacking(cfg)                         # what the run's kind of model has nothing for (models.py)
    if cfg.window_layers and not cfg.window:
        raise UsageError(f"--window-layers {cfg.window_layers} chooses the layers of --window: give --window W")


def _check_watch(cfg, world):
    if cfg.buddy_every and cfg.on_failure != "shrink":
        raise UsageError(f"--buddy-every {cfg.buddy_every} keeps copies for --on-failure shrink: give that too")


# the rules between options, by group (GROUPS), in the order they are checked
GROUP_CHECKS = {"run": _check_run, "layout": _check_layout, "optim": _check_optim, "data": _check_data,
                "model": _check_model, "watch": _check_watch}
