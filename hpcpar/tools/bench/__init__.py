"""The benchmark suite behind ``hpcpar bench`` and ``make bench`` (docs/performance.md reads it).

One module per benchmark.  Each defines ``run(quick)``, which measures on the ranks it was started
with and returns a ``common.Result`` on rank 0 (``None`` elsewhere).  The serial driver (driver.py)
starts every benchmark as its own process - under ``mpiexec -n N`` when it needs N ranks - so that
no benchmark inherits another's memory, threads or MPI state, and collects the results into
bench/results.json and BENCHMARKS.md.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Spec:
    label: str          # the section's letter, or a short tag
    module: str         # hpcpar.tools.bench.<module>
    title: str
    ranks: tuple = ()   # world sizes to run at (() = one serial process)
    quick_ranks: tuple = ()
    timeout: int = 300  # seconds per process, so that a hang fails one benchmark, not the suite
    env: tuple = ()     # (name, value) pairs set for this benchmark's processes (an MPI setting)

    def world_sizes(self, quick):
        sizes = self.quick_ranks if quick and self.quick_ranks else self.ranks
        return sizes or (None,)


BENCHMARKS = {
    "gemm": Spec("a", "gemm", "GEMM rate at the training shapes against the BLAS peak"),
    "p2p": Spec("b", "p2p", "Point-to-point latency and bandwidth: hpcpar.comm against raw mpi4py",
                ranks=(2,)),
    "collectives": Spec("c", "collectives", "Collectives: hpcpar.comm against raw mpi4py",
                        ranks=(2, 4), quick_ranks=(2,)),
    "engine": Spec("d", "engine", "The engine against PyTorch eager on one core"),
    "fast-ops": Spec("fo", "fast_ops",
                     "Each fast op against the plain one beside it, at the 8-layer step's shapes; the blocked AdamW"),
    "step": Spec("s", "step", "A training step of the 8-layer GPT on one rank against PyTorch eager, at 1 and 2 "
                 "threads, and where its time goes", timeout=1500),
    "bf16-step": Spec("bf", "bf16_step", "bf16 on the CPU's matrix units: the GEMM providers' rates; a bf16 step "
                      "against PyTorch autocast at hidden 512 and 1024, fp32 with oneMKL against eager, one "
                      "thread; the bf16 step against its GEMM floor", timeout=1500),
    "bf16-cores": Spec("bf2", "bf16_cores", "bf16 on the whole 2-core machine: hpcpar's 2-rank layouts against "
                       "PyTorch autocast on 2 threads; a bf16 run on real text against fp32", timeout=1500),
    "torch-parallel": Spec("e", "torch_parallel", "Pipeline, tensor and data parallelism against "
                           "torch.distributed on gloo", ranks=(2,), timeout=900),
    "pp-breakdown": Spec("ppb", "pp_breakdown", "A pp 2, 1F1B step by stage: compute, messages, bubble, tied sum; "
                         "ours against torch.distributed.pipelining", ranks=(2,), timeout=600),
    "layout": Spec("f", "layout", "tp 2 x pp 2 x dp 2 against one rank, same global batch"),
    "gpu": Spec("g", "gpu", "GPU: GEMM rate and the block on the device (cupy)"),
    "gpu-step": Spec("gs", "gpu_step", "GPU: a GPT-2 124M step in fp32, tf32, fp16 and bf16 against PyTorch; "
                     "staging"),
    "tp-block": Spec("tp", "tp_block", "A transformer block at tp = 1 and tp = 2: time and bytes moved",
                     ranks=(2,)),
    "bubble": Spec("pp", "bubble", "Pipeline bubble: the engine measured against the simulator", ranks=(2,)),
    "recompute": Spec("rc", "recompute", "Activation recomputation: memory kept per micro-batch and step time, "
                      "none / selective / full, GPT-2 and Llama"),
    "ring": Spec("cp", "ring", "Ring attention (context parallelism): bytes against the formula, communication "
                 "hidden behind the blocks", ranks=(2, 4), quick_ranks=(2,)),
    "overlap": Spec("o", "overlap", "Data parallelism: the gradient all-reduce hidden behind the backward",
                    ranks=(2, 8), quick_ranks=(2,), timeout=600),
    "overlap-async": Spec("oa", "overlap", "The same with MPICH's progress thread (MPIR_CVAR_ASYNC_PROGRESS=1)",
                          ranks=(2,), timeout=600, env=(("MPIR_CVAR_ASYNC_PROGRESS", "1"),)),
    "overlap-rd": Spec("or", "overlap", "The same with MPICH's recursive-doubling Iallreduce (fewer rounds)",
                       ranks=(2,), timeout=600,
                       env=(("MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM", "sched_recursive_doubling"),)),
    "documents": Spec("doc", "documents", "Attention over windows of 4 documents (--documents) against plain "
                      "causal attention: the key blocks skipped"),
    "moe": Spec("moe", "moe", "The mixture-of-experts block, forward + backward, against PyTorch eager "
                "(transformers' loop over experts)"),
    "muon": Spec("mu", "muon", "Muon's update against AdamW's on one rank: time, Newton-Schulz's FLOPs, state"),
    "muon-tp": Spec("mt", "muon", "Muon's tensor-parallel modes: the update's time and bytes; blockwise against the "
                    "exact modes (update cosine, loss after 50 steps)", ranks=(2, 4, 8), quick_ranks=(2,),
                    timeout=900),
    "muon-train": Spec("mtr", "muon_train", "Does Muon train better: AdamW against Muon at their best learning rates, "
                       "steps to a fixed loss on the synthetic language and data/sample.txt", timeout=2400),
    "planner": Spec("pl", "planner", "The planner's search: GPT-3 175B on 1024 GPUs (hpcpar plan)"),
    "zero": Spec("z", "zero", "ZeRO 0-3: model state per rank counted against the planner (8 ranks); ZeRO-3's "
                 "step against ZeRO-1's and the gathers prefetching hides (2 and 8 ranks)", ranks=(2, 8),
                 quick_ranks=(2,), timeout=900),
    "watchdog": Spec("wd", "watchdog", "Watchdog and flight recorder: their share of a 2x2x2 step", ranks=(8,)),
    "shrink": Spec("sh", "shrink", "A dead rank under --on-failure shrink (Open MPI, ULFM): SIGKILL to the first "
                   "new step at 4 and 8 ranks against a relaunch; the buddies' in-memory copies per step", timeout=2400),
    "threads": Spec("th", "threads", "The README's first run: hpcpar's BLAS thread choice against one thread, "
                    "idle and with six busy processes", timeout=1200),
}
