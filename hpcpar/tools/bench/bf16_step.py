"""(bf) bf16 on the CPU's matrix units: the GEMM providers' rates, and a bf16 training step on one thread
against PyTorch's ``torch.autocast("cpu", dtype=torch.bfloat16)`` step.

The model is the step benchmark's (s) GPT (ffn 4 x hidden, 8 layers, 8 heads, vocabulary 1024, 16
sequences of 128 tokens, SGD with momentum and clipping), at hidden 512 and 1024.

1. GEMM rates at the step's projection shapes, one thread: bf16 on every installed provider (numpy's is
   the emulation: cast to fp32 and multiplied there), fp32 on numpy's BLAS, and PyTorch's bf16 and fp32
   ``mm`` - which library gives the step its floor;
2. ours ``--precision bf16`` (the provider auto chooses, named) against PyTorch's autocast step, and
   fp32 with oneMKL's sgemm (``--gemm mkl``) against PyTorch eager fp32: medians of >= 5 alternating
   rounds, CPU seconds;
3. our bf16 step by category against its own bf16 GEMM floor (training/profiler.py): what is left
   outside the GEMMs.
"""
import time

import numpy as np

from hpcpar import blas
from hpcpar.tools.bench.common import (PEER_ROUNDS, Result, import_torch, interleave, ms, pct, ratio, spread, summary,
                                 torch_tensor)
from hpcpar.tools.bench.engine import step_cases
from hpcpar.runtime import UsageError

MODEL = dict(ffn=0, layers=8, heads=8, seq_len=128, vocab=1024, batch_size=16)
QUICK_MODEL = dict(ffn=0, layers=2, heads=2, seq_len=32, vocab=64, batch_size=4)
HIDDEN, QUICK_HIDDEN = (512, 1024), (32,)
TARGET, FP32_TARGET, FLOOR_TARGET = 0.85, 0.95, 1.7


def dims(hidden, quick):
    return dict(QUICK_MODEL if quick else MODEL, hidden=hidden, ffn=4 * hidden)


def autocast_case(torch, trainer):
    """PyTorch's bf16 step: the step benchmark's torch.nn GPT under CPU autocast (bf16 GEMMs on oneDNN,
    fp32 weights, gradients and SGD), the same batch, clipping and optimizer as ours."""
    from hpcpar.tools.bench.torch_gpt import Stage, loss_fn, torch_optimizer
    cfg = trainer.cfg
    ids, targets = (torch_tensor(torch, a).long() for a in trainer.data.batch(0, range(cfg.batch_size)))
    model = Stage(trainer.mcfg)
    opt = torch_optimizer(model, cfg)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model(ids), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad()
    return step


def bench_rates(res, torch, hidden, quick):
    """GFLOP/s of the step's projection GEMMs (tokens x hidden -> 3, 4 hidden; 4 hidden -> hidden)."""
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    n = 16 * 128 if not quick else 128
    shapes = [(n, hidden, 3 * hidden), (n, hidden, 4 * hidden), (n, 4 * hidden, hidden)]
    rng = np.random.default_rng(0)
    rows, figures = [], {}
    for M, K, N in shapes:
        a32, b32 = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
        a16, b16 = a32.astype(bf16), b32.astype(bf16)
        out = np.empty((M, N), np.float32)
        cases = {f"bf16, {p.name}": (lambda p=p: p.matmul(a16, b16, out)) for p in blas.installed()}
        cases["fp32, numpy"] = lambda: np.matmul(a32, b32, out=out)
        if torch is not None:
            t32, t16 = torch.from_numpy(a32), torch.from_numpy(a32).bfloat16()
            u32, u16 = torch.from_numpy(b32), torch.from_numpy(b32).bfloat16()
            cases.update({"bf16, PyTorch": lambda: t16 @ u16, "fp32, PyTorch": lambda: t32 @ u32})
        times = interleave(cases, 2 if quick else 5)
        rate = {k: 2 * M * N * K / np.median(v) / 1e9 for k, v in times.items()}
        figures[f"{M}x{K}x{N}"] = rate
        rows.append([f"{M} x {K} x {N}"] + [f"{rate[k]:.0f}" for k in cases])
    res.figures["gemm_rates_gflops"] = figures
    res.table(f"GEMM rates at the hidden-{hidden} step's projection shapes, one thread (GFLOP/s, median of "
              "alternating rounds, CPU time)", ["M x K x N"] + list(cases), rows,
              ["bf16, numpy: the emulation (inputs cast to fp32, numpy's BLAS). The providers: hpcpar/blas; "
               "the CPU's flags are in the machine table."])


def bench_steps(res, torch, quick):
    rows = []
    rounds = 2 if quick else PEER_ROUNDS
    for hidden in (QUICK_HIDDEN if quick else HIDDEN):
        trainer, cases, _ = step_cases(None, dict(dims(hidden, quick), precision="bf16", gemm=""), "sgd")
        used = blas.summary()
        if torch is None:
            rows.append([str(hidden), "bf16", used, ms(min(interleave(cases, rounds)["ours"])), "-", "-"])
            continue
        cases["torch"] = autocast_case(torch, trainer)
        fig = summary(interleave(cases, rounds), "ours", "torch")
        res.figures[f"bf16 step, hidden {hidden}"] = dict(fig, provider=blas.provider().name)
        rows.append([str(hidden), "bf16 / PyTorch autocast bf16", used, ms(fig["ours_median_s"]),
                     ms(fig["theirs_median_s"]), spread(fig)])
        res.target(f"bf16 step, hidden {hidden}, 1 thread: ours / PyTorch autocast (median of rounds)",
                   f"<= {TARGET:.2f}x", spread(fig), fig["ratio_median_paired"] <= TARGET)
    if torch is not None:
        try:
            blas.load("mkl")
            trainer, cases, _ = step_cases(torch, dict(dims(HIDDEN[0] if not quick else 32, quick), gemm="mkl"),
                                           "sgd")
            fig = summary(interleave(cases, rounds), "ours", "torch")
            res.figures["fp32 step, mkl"] = fig
            rows.append([str(trainer.mcfg.d_model), "fp32 / PyTorch eager fp32", blas.summary(),
                         ms(fig["ours_median_s"]), ms(fig["theirs_median_s"]), spread(fig)])
            res.target("fp32 step with oneMKL's sgemm, 1 thread: ours / PyTorch eager", f"<= {FP32_TARGET:.2f}x",
                       spread(fig), fig["ratio_median_paired"] <= FP32_TARGET)
        except UsageError as err:
            rows.append([str(HIDDEN[0]), "fp32 / PyTorch eager fp32", str(err), "-", "-", "-"])
    res.table("One training step, one thread, against PyTorch (CPU seconds; the step benchmark's GPT, "
              "ffn 4 x hidden, SGD)", ["hidden", "precision / peer", "our GEMM provider (why)", "ours (median)",
                                       "peer (median)", "ours / peer: median of the rounds (range)"], rows,
              ["PyTorch's bf16: torch.autocast('cpu', dtype=torch.bfloat16) around the forward and the loss, "
               "fp32 weights, gradients and optimizer - what a PyTorch user runs for speed on a CPU.",
               "Ours: --precision bf16 (fp32 masters and gradients, bf16 activations and GEMM inputs; "
               "hpcpar/precision.py) with the provider auto chooses; the fp32 row forces --gemm mkl."])


def bench_floor(res, quick):
    """The bf16 step by category against its own GEMM floor (the first step times its GEMMs alone)."""
    from hpcpar.training.profiler import Profiler
    trainer, _, _ = step_cases(None, dict(dims(HIDDEN[0] if not quick else 32, quick), precision="bf16", gemm=""),
                               "sgd")
    trainer.step(0)
    prof = Profiler(time.process_time).install(trainer.grid.communicators())
    try:
        for k in range(2 if quick else 3):
            with prof.step(floor=k == 0):
                trainer.step(1 + k)
    finally:
        prof.remove()
    figures = prof.per_step()
    step, floor = figures["step"], figures["gemm_floor"]
    res.figures["bf16 profile"] = dict(figures, gemm_in_step=prof.gemm_seconds / prof.steps)
    rows = [[k, ms(v), pct(v / step)] for k, v in figures.items() if k not in ("step", "gemm_floor")]
    rows += [["step", ms(step), "100%"], ["bf16 GEMM floor: the step's GEMMs timed alone", ms(floor),
                                          pct(floor / step)]]
    res.table(f"Where the bf16 step goes, hidden {trainer.mcfg.d_model} ({blas.summary()}; CPU seconds, mean of "
              "the counted steps)", ["category", "time", "share of the step"], rows,
              ["GEMM: every precision.gemm call outside attention, with its output's rounding to bf16; "
               "attention: its batched GEMMs; the rest as in the step benchmark's table (s)."])
    res.target("bf16 step / its own bf16 GEMM floor", f"<= {FLOOR_TARGET:.2f}x", ratio(step / floor),
               step / floor <= FLOOR_TARGET)


def run(quick):
    torch, why_not = import_torch()
    res = Result(why_not)
    bench_rates(res, torch, QUICK_HIDDEN[0] if quick else HIDDEN[0], quick)
    bench_steps(res, torch, quick)
    bench_floor(res, quick)
    return res
