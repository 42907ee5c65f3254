"""Published large-scale training runs: model, machine, layout, throughput, memory - and the source.

Every run is a row of a TOML file in ``hpcpar/tools/plan/runs/`` (one file per publication or benchmark
table): its source (URL, table, row), its layout as published, and the figures it reports - step
time, TFLOP/s per GPU (with the FLOP convention the source used), or tokens/s per GPU, and the
memory per GPU where the source gives one.  What a source leaves open (micro-batch size, chunks, the
schedule) is left to the planner, which picks its best choice among the options that engine had.

Throughput is compared as step time: a published TFLOP/s per GPU is turned back into seconds per
step with the FLOP count that source used (``convention``), tokens/s per GPU with the batch.

``role = "fitting"`` rows fix the GEMM factor of each hardware profile (calibrate.fit_calibration);
``role = "framework-fitting"`` rows the four framework constants of fit.py (eager PyTorch's GEMM
efficiency with and without recomputation, torchao Float8's fp8 GEMM efficiency, the caching
allocator's cache).  Every other row is held out ("validation"): nothing was fitted to it.
"""
from dataclasses import dataclass, field
from importlib import resources

from hpcpar.tools.plan import catalog
from hpcpar.tools.plan.flops import narayanan_flops, step_flops
from hpcpar.tools.plan.job import Engine
from hpcpar.runtime import UsageError

# What each framework's runs could do: the engine's features and the options the search may choose.
# Megatron-LM 2021: fp16, full recomputation, 1F1B or interleaved, no sequence parallelism or
# distributed optimizer yet, its scatter/gather p2p optimisation (section 4.1), blocking p2p
# send/recv pairs, DP all-reduce after the backward.
# PyTorch's caching allocator reserves beyond what it allocates: fit.fit_allocator_cache on the
# "framework-fitting" row of torchtitan-h100.toml (Llama 3.1 8B, FSDP + CP 1, 32K).
PYTORCH = dict(numpy_caches=False, shard_grad_buffer=False, fsdp_reduce_once=False,
               allocator_cache=0.121)
# Eager PyTorch (no torch.compile): fit.fit_gemm_efficiency on the "framework-fitting" row of
# llm-foundry-h100.toml (MPT-30B on 16 GPUs, activation checkpointing); a run sets eager = true where
# its source ran eager.
EAGER = dict(gemm_efficiency=0.796)
# Eager Composer (llm-foundry) without recomputation sustains less (the llm-foundry table's own HFU):
# fit.fit_gemm_efficiency(name="gemm_efficiency_no_recompute") on that file's MPT-3B row on 16 GPUs.
# Measured on Composer only, so it is llm-foundry's (FRAMEWORKS' "eager" entry), not every eager run's.
COMPOSER_EAGER = dict(gemm_efficiency_no_recompute=0.644)
# torchao's Float8 training (torchtitan's fp8 rows): fit.fit_gemm_efficiency(name="fp8_efficiency") on
# the "framework-fitting" Float8 row of torchtitan-h100.toml (Llama 3.1 8B FSDP + compile + Float8).
FLOAT8 = dict(fp8_efficiency=0.791)
# torchtitan computes the loss as cross_entropy(logits.float()): 16-bit logits, their fp32 copy and the
# fp32 log-softmax saved for the backward (memory.py).  llm-foundry's MPT (ComposerMPTCausalLM, loss_fn
# "fused_crossentropy" by default: flash_attn's CrossEntropyLoss) computes it in one kernel from the
# 16-bit logits, which are all it keeps (with one fp32 log-sum-exp per token).
EAGER_LOSS = dict(loss_bytes_per_logit=2 + 4 + 4)
FUSED_LOSS = dict(loss_bytes_per_logit=2)
# schedules: what each engine ran, as its runs were published (1F1B, interleaved 1F1B); none of the
# runs used ZB-H2 or a V schedule, so the planner offers them none (hpcpar's own search offers every one).
FRAMEWORKS = {
    "megatron-2021": dict(engine=dict(scatter_gather_p2p=True, overlap_dp=False, overlap_p2p=False,
                                      mixed_state_bytes=(2, 2, 16)),
                          recompute=("full",), schedules=("1f1b", "interleaved"), zero=(0,), sp=(False,),
                          dtype="fp16"),
    # Megatron-DeepSpeed (BLOOM, MT-NLG): DeepSpeed's 1F1B pipeline (blocking p2p), full recomputation,
    # ZeRO-1; its BF16 optimizer adds an unsharded fp32 gradient buffer (BLOOM README): 2 + (2 + 4) + 12/d.
    "megatron-deepspeed": dict(engine=dict(overlap_dp=False, overlap_p2p=False, mixed_state_bytes=(2, 6, 12)),
                               recompute=("full",), schedules=("1f1b",), zero=(1,), sp=(False,), dtype="bf16"),
    # NeMo / Megatron-Core 2024 (Nemotron-4; Llama 3 in section 3.3.2 describes the same features):
    # interleaved 1F1B, sequence parallelism, distributed optimizer, flash attention, overlapped DP,
    # bf16 parameters with fp32 gradients, selective or no recomputation.
    "megatron-core": dict(engine=dict(flash_attention=True, scatter_gather_p2p=True, mixed_state_bytes=(2, 4, 12)),
                          recompute=("none", "selective", "full"), schedules=("1f1b", "interleaved"), zero=(1,),
                          sp=(True,), dtype="bf16"),
    # torchtitan (FSDP2): flash attention (SDPA), fp32 sharded parameters, gradients and Adam state,
    # bf16 compute, fp32 gradient reduction; TP with sequence parallelism, PP schedules, CP.
    # With PP it does not reshard after forward: each stage's weights stay gathered all step.  Its
    # selective recomputation is the op-level policy (every second matmul output kept).
    "torchtitan": dict(engine=dict(EAGER_LOSS, **FLOAT8, flash_attention=True, mixed_state_bytes=(4, 4, 8),
                                   fsdp_gather_once_with_pp=True, selective_ops=True),
                       recompute=("none", "selective", "full"), schedules=("1f1b", "interleaved"), zero=(3,),
                       sp=(True,), dtype="bf16"),
    # llm-foundry (Composer FSDP, FULL_SHARD): flash (triton) attention, fp32 sharded state, fused loss;
    # run eagerly, its own GEMM efficiency where nothing is recomputed ("eager": added to EAGER).
    "llm-foundry": dict(engine=dict(FUSED_LOSS, flash_attention=True, mixed_state_bytes=(4, 4, 8)),
                        eager=COMPOSER_EAGER,
                        recompute=("none", "full"), schedules=("1f1b",), zero=(3,), sp=(False,), dtype="bf16"),
    # DeepSeek's HAI-LLM as the V3 report describes it (section 3.2): DualPipe (hpcpar's nearest is its V
    # form, dualpipev), its all-to-alls overlapped with the paired chunk's compute, FP8 GEMMs (3.3), flash
    # attention, ZeRO-1, no TP or SP; BF16 weights, FP32 gradients, FP32 master weights and BF16 AdamW
    # moments (3.3.3): 2 + 4 + (4 + 2 + 2); it recomputes the norms and MLA's up-projections (selective).
    "hai-llm": dict(engine=dict(flash_attention=True, fp8=True, overlap_ep=True, mixed_state_bytes=(2, 4, 8)),
                    recompute=("none", "selective", "full"), schedules=("dualpipev",), zero=(1,), sp=(False,),
                    dtype="bf16"),
}
for _name in ("torchtitan", "llm-foundry", "megatron-core"):
    FRAMEWORKS[_name]["engine"] = dict(PYTORCH, **FRAMEWORKS[_name]["engine"])


@dataclass(frozen=True)
class Run:
    name: str
    source: str                 # publication, table and row
    url: str
    framework: str              # a key of FRAMEWORKS
    model: str                  # preset name or dims string
    hardware: str
    gpus: int
    global_batch: int
    seq_len: int
    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1                     # expert-parallel size (a mixture of experts)
    tflops_per_gpu: float = 0.0     # as published ...
    convention: str = ""            # ... counted with "narayanan-96" (recomputation included) or "model"
    step_seconds: float = 0.0       # or the published step time itself
    tokens_per_gpu: float = 0.0     # or tokens per second per GPU
    memory_gib: float = 0.0         # published memory per GPU (0: not published)
    mb: int = 0                     # 0: not published
    v: int = 0
    recompute: str = ""             # "": not published, the planner chooses
    schedule: str = ""
    engine: dict = field(default_factory=dict)              # per-run engine features (fp8, overlap_tp)
    hardware_changes: dict = field(default_factory=dict)    # inter_GBps, memory_GiB, hbm_GBps
    eager: bool = False             # PyTorch without torch.compile (EAGER, and the framework's "eager")
    role: str = "validation"        # or "fitting" (the hardware's GEMM factor), "framework-fitting" (fit.py)
    fits: str = ""                  # framework-fitting: the constant it fixes (gemm_efficiency,
                                    # gemm_efficiency_no_recompute, fp8_efficiency, allocator_cache)

    @property
    def features(self):
        f = FRAMEWORKS[self.framework]
        eager = dict(EAGER, **f.get("eager", {})) if self.eager else {}
        engine = Engine(**dict(f["engine"], **eager, **self.engine))
        return dict(f, engine=engine)

    def published_step(self, model):
        """Seconds per step as published (from the step time, the tokens/s or the TFLOP/s)."""
        if self.step_seconds:
            return self.step_seconds
        if self.tokens_per_gpu:
            return self.global_batch * self.seq_len / (self.tokens_per_gpu * self.gpus)
        if self.convention == "narayanan-96":
            flops = narayanan_flops(self.global_batch, self.seq_len, model.layers, model.hidden, model.vocab,
                                    recompute=True)
        else:
            flops = step_flops(model, self.global_batch, self.seq_len)
        return flops / (self.tflops_per_gpu * 1e12 * self.gpus)


def read_runs(mapping, name):
    """The runs of one TOML file: its top-level keys are shared by every [[run]] table."""
    shared = {k: v for k, v in mapping.items() if k != "run"}
    known = set(Run.__dataclass_fields__)
    runs = []
    for row in mapping.get("run", []):
        values = dict(shared, **row)
        unknown = set(values) - known
        if unknown:
            raise UsageError(f"published runs {name}: unknown keys {', '.join(sorted(unknown))}")
        if values.get("framework") not in FRAMEWORKS:
            raise UsageError(f"published runs {name}: framework must be one of {', '.join(FRAMEWORKS)}")
        try:
            runs.append(Run(**values))
        except TypeError as err:
            raise UsageError(f"published runs {name}: {err}") from None
    return runs


def load_runs():
    """Every run of every shipped file, in file order."""
    out = []
    for name in catalog.names("runs"):
        text = (resources.files("hpcpar.tools.plan") / "runs" / f"{name}.toml").read_bytes().decode()
        out += read_runs(catalog.tomllib.loads(text), name)
    return out


RUNS = load_runs()
