"""Published large-scale training runs: model, machine, layout, throughput - and where each is from.

Every row states what its paper states; what the paper leaves open (micro-batch size, chunks, the
schedule) is left to the planner, which picks its best choice among the options that engine had.
Throughput is compared as step time: a paper's TFLOP/s per GPU is turned back into seconds per step
with the FLOP count that paper used (``convention``), so no formula difference enters the comparison.

Rows with ``role = "calibration"`` fix the one GEMM factor of their hardware profile
(calibrate.fit_calibration): Narayanan et al.'s weak-scaling Table 1 for the A100, NVIDIA's published
benchmark recipe for the H100.  The other rows - five other publications - are validation
(tests/test_plan_validation.py): nothing was fitted to them.
"""
from dataclasses import dataclass, field

from hpcpar.plan.flops import narayanan_flops, step_flops
from hpcpar.plan.job import Engine

NARAYANAN = "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters " \
            "Using Megatron-LM, arXiv:2104.04473"
# Megatron-LM 2021: fp16, full recomputation, 1F1B or interleaved, no sequence parallelism or
# distributed optimizer yet, its scatter/gather p2p optimisation (section 4.1), blocking p2p
# send/recv pairs, DP all-reduce after the backward.
MEGATRON_2021 = dict(engine=Engine(scatter_gather_p2p=True, overlap_dp=False, overlap_p2p=False,
                                    mixed_state_bytes=(2, 2, 16)), recompute=("full",),
                     schedules=("1f1b", "interleaved"), zero1=(False,), sp=(False,), dtype="fp16")
# Megatron-DeepSpeed (BLOOM, MT-NLG): DeepSpeed's 1F1B pipeline (blocking p2p), full recomputation,
# ZeRO-1.
# Its BF16 optimizer adds an unsharded fp32 gradient buffer (BLOOM README): 2 + (2 + 4) + 12/d bytes.
DEEPSPEED = dict(engine=Engine(overlap_dp=False, overlap_p2p=False, mixed_state_bytes=(2, 6, 12)),
                 recompute=("full",), schedules=("1f1b",), zero1=(True,),
                 sp=(False,), dtype="bf16")
# NeMo / Megatron-Core 2024 (Nemotron-4): interleaved 1F1B, sequence parallelism, distributed
# optimizer, flash attention, overlapped DP, selective or no recomputation.
MCORE_2024 = dict(engine=Engine(flash_attention=True, scatter_gather_p2p=True, mixed_state_bytes=(2, 4, 12)),
                  recompute=("none", "selective", "full"),
                  schedules=("1f1b", "interleaved"), zero1=(True,), sp=(True,), dtype="bf16")

# Llama 3 (section 3.3.2): interleaved 1F1B with uneven stages (one layer fewer on the first and last),
# sequence parallelism and sharded optimizer state, flash attention; modelled with the features above.
LLAMA3 = MCORE_2024


@dataclass(frozen=True)
class Run:
    name: str
    source: str
    model: str                  # preset name or dims string
    hardware: str
    gpus: int
    global_batch: int
    seq_len: int
    tp: int
    pp: int
    dp: int
    features: dict              # engine, recompute, schedules, zero1, sp, dtype (see the dicts above)
    tflops_per_gpu: float = 0.0     # as published ...
    convention: str = ""            # ... counted with "narayanan-96" (recomputation included) or "model"
    step_seconds: float = 0.0       # or the published step time itself
    mb: int = 0                     # 0: not published
    v: int = 0
    hardware_changes: dict = field(default_factory=dict)   # e.g. a slower network than the profile's
    role: str = "validation"

    def published_step(self, model):
        """Seconds per step as published (from the step time or the TFLOP/s and its convention)."""
        if self.step_seconds:
            return self.step_seconds
        if self.convention == "narayanan-96":
            flops = narayanan_flops(self.global_batch, self.seq_len, model.layers, model.hidden, model.vocab,
                                    recompute=True)
        else:
            flops = step_flops(model, self.global_batch, self.seq_len)
        return flops / (self.tflops_per_gpu * 1e12 * self.gpus)


def _narayanan_t1(params, heads, h, layers, tp, pp, gpus, batch, tflops, role="calibration"):
    return Run(f"Megatron {params}B", NARAYANAN + ", Table 1", f"l={layers},h={h},a={heads},V=51200,dropout=1",
               "a100", gpus, batch, 2048, tp, pp, gpus // (tp * pp), MEGATRON_2021, tflops, "narayanan-96",
               role=role)


RUNS = [
    _narayanan_t1(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    _narayanan_t1(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    _narayanan_t1(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    _narayanan_t1(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    _narayanan_t1(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    _narayanan_t1(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    _narayanan_t1(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
    # Table 2, PTD-P rows (micro-batch 1): the GPT-3 shape at three scales, batch 1536
    *[Run(f"GPT-3 175B, {n} GPUs", NARAYANAN + ", Table 2 (PTD-P)", "gpt3-175b", "a100", n, 1536, 2048, 8, 12,
          n // 96, MEGATRON_2021, tflops, "narayanan-96", mb=1) for n, tflops in ((384, 153), (1536, 141))],
    Run("BLOOM 176B", "BigScience tr11-176B-ml README (bigscience-workshop/bigscience): TP=4 PP=12 DP=8 MBS=2 "
        "GBS=2048; log at iteration 85376: 104.70 s per iteration, 149.77 TFLOPs", "bloom-176b", "a100", 384,
        2048, 2048, 4, 12, 8, DEEPSPEED, step_seconds=104.70, mb=2,
        # Jean Zay: 4 Omni-Path 100 Gb/s links per node of 8 GPUs = 6.25 GB/s per GPU (same README)
        hardware_changes={"inter_bandwidth": 6.25e9}),
    Run("MT-NLG 530B", "Smith et al. 2022, arXiv:2201.11990, section 2.4 (280 DGX A100 nodes, batch 1920: "
        "60.1 s per iteration, 126 TFLOP/s per GPU)", "mt-nlg-530b", "a100", 2240, 1920, 2048, 8, 35, 8,
        DEEPSPEED, step_seconds=60.1, mb=1),
    Run("Nemotron-4 340B (calibration)", "NVIDIA DGXC Benchmarking recipe Nemotron4 340B 24.11 (NGC catalog): "
        "BF16, 128 H100, TP=8 PP=8 VP=12 MBS=1 GBS=32, training step 4.77 s", "nemotron-4-340b", "h100",
        128, 32, 4096, 8, 8, 2, MCORE_2024, step_seconds=4.77, mb=1, v=12, role="calibration"),
    Run("Nemotron-4 340B", "NVIDIA 2024, Nemotron-4 340B Technical Report, arXiv:2406.11704, Table 2: "
        "6144 H100, TP=8 PP=12 DP=64, batch 2304, 8.0 s per iteration, MFU 41.0%", "nemotron-4-340b", "h100",
        6144, 2304, 4096, 8, 12, 64, MCORE_2024, step_seconds=8.0, mb=1),
    Run("Llama 3 405B", "Dubey et al. 2024, The Llama 3 Herd of Models, arXiv:2407.21783, Table 4: "
        "8192 H100, TP=8 CP=1 PP=16 DP=64, sequence 8192, 16M tokens per batch, 430 TFLOPs/GPU",
        "llama3-405b", "h100", 8192, 2048, 8192, 8, 16, 64, LLAMA3, 430, "model", mb=1),
    Run("Llama 3 405B", "Dubey et al. 2024, arXiv:2407.21783, Table 4: 16384 H100, TP=8 CP=1 PP=16 DP=128, "
        "sequence 8192, 16M tokens per batch, 400 TFLOPs/GPU", "llama3-405b", "h100", 16384, 2048, 8192,
        8, 16, 128, LLAMA3, 400, "model", mb=1),
]
