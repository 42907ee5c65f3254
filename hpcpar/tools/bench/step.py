"""(s) A GPT training step on one rank against PyTorch eager, and where its time goes.

The model is the larger one of the performance notes (hidden 512, ffn 2048, 8 layers, 8 heads,
vocabulary 1024, 16 sequences of 128 tokens, fp32), trained with SGD (momentum 0.9) and gradient
clipping on both sides, so that the step is the model's arithmetic and not an optimizer's.

1. ours (``Trainer.step``) against the same step in torch.nn, eager and under torch.compile, side by
   side, at one BLAS/intra-op thread (CPU seconds) and, eager only, at two (wall seconds: two threads'
   CPU seconds add up, their speed-up does not show in them); each row the median of 5 rounds;
2. our step by category (hpcpar/training/profiler.py: GEMM, attention, element-wise, ...; CPU seconds, the
   first step measures the GEMM floor) - the table that says what is left to gain outside the GEMMs;
3. both steps cut in two, GEMMs and the rest, side by side: ours by its GEMM floor, PyTorch's by the self
   time of its GEMM ops under torch.profiler.  The GEMM ratio is the machine's (numpy's BLAS against
   PyTorch's MKL on this CPU), the rest's ratio is the engine's own; and our GEMMs alone over the peer's
   whole step is the lowest ratio any non-GEMM work could reach here, the bound a target sits under.
"""
import time

from hpcpar.tools.bench.common import PEER_ROUNDS, Result, import_torch, interleave, ms, pct, ratio, spread, summary
from hpcpar.tools.bench.engine import step_cases
from hpcpar.tools.bench.machine import set_blas_threads

MODEL = dict(hidden=512, ffn=2048, layers=8, heads=8, seq_len=128, vocab=1024, batch_size=16)
QUICK_MODEL = dict(hidden=32, ffn=128, layers=2, heads=2, seq_len=32, vocab=64, batch_size=4)
TARGET, FLOOR_TARGET = 0.90, 1.10
TORCH_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")    # every GEMM a torch.nn GPT step runs


def threads(torch, n):
    set_blas_threads(n)
    if torch is not None:
        torch.set_num_threads(n)


def bench_against_torch(res, trainer, cases, torch, quick):
    rows = []
    peers = [("torch", "PyTorch eager"), ("torch_compile", "torch.compile")]
    for n, clock in ((1, time.process_time), (2, time.perf_counter)):
        threads(torch, n)
        run = cases if n == 1 else {k: v for k, v in cases.items() if k != "torch_compile"}   # eager at 2
        times = interleave(run, 2 if quick else PEER_ROUNDS, clock)
        threads(torch, 1)
        if torch is None:
            rows.append([str(n), "-", ms(min(times["ours"])), "-", "-", "-"])
            continue
        for key, peer in peers:
            if key not in times:
                continue
            fig = summary(times, "ours", key)
            res.figures[f"step, {n} thread{'s' * (n > 1)}, {peer}"] = fig
            rows.append([str(n), peer, ms(fig["ours_median_s"]), ms(fig["theirs_median_s"]), spread(fig),
                         ratio(fig["ratio"])])
            if n == 1:
                res.target(f"one rank, one thread: ours / {peer} (median of rounds)", f"<= {TARGET:.2f}x",
                           spread(fig), fig["ratio_median_paired"] <= TARGET)
    m = trainer.mcfg
    res.table(f"One training step on one rank: hidden {m.d_model}, ffn {m.d_ff}, {m.n_layer} layers, {m.n_head} heads, "
              f"vocabulary {m.vocab_size}, {trainer.cfg.batch_size} x {m.seq_len} tokens, fp32, SGD",
              ["threads", "peer", "ours (median)", "peer (median)", "ours / peer: median of the rounds (range)",
               "best rounds' ratio"], rows,
              ["1 thread: CPU seconds of the process; 2 threads: wall seconds (both threads' CPU seconds would "
               "add up), so the 2-thread row is only as good as the machine was quiet.",
               "torch.compile: the same model under the default inductor backend, compiled before the rounds; "
               "at 1 thread only."])


def bench_profile(res, trainer, quick):
    from hpcpar.training.profiler import Profiler
    prof = Profiler(time.process_time).install(trainer.grid.communicators())
    try:
        for k in range(2 if quick else 3):
            with prof.step(floor=k == 0):
                trainer.step(10 ** 5 + k)
    finally:
        prof.remove()
    figures = prof.per_step()
    res.figures["profile"] = figures
    res.figures["gemm_in_step"] = prof.gemm_seconds / prof.steps
    step, floor = figures["step"], figures["gemm_floor"]
    rows = [[k, ms(v), pct(v / step)] for k, v in figures.items() if k not in ("step", "gemm_floor")]
    rows += [["step", ms(step), "100%"], ["GEMM floor: the step's GEMMs timed alone", ms(floor), pct(floor / step)]]
    res.table("Where our one-rank step goes (hpcpar train --profile; CPU seconds, mean of the counted steps)",
              ["category", "time", "share of the step"], rows,
              ["Exclusive times: a softmax inside attention counts as element-wise, attention's batched "
               "GEMMs as attention; 'other' is what no category claims (Python between the ops, copies).",
               f"step / GEMM floor = {step / floor:.2f}x: what a step made of nothing but its GEMMs would save."])
    res.target("one rank: step / its own GEMM floor", f"<= {FLOOR_TARGET:.2f}x", ratio(step / floor),
               step / floor <= FLOOR_TARGET)


def peer_gemm_seconds(torch, step, steps):
    """Seconds per step that a PyTorch step spends inside its GEMM ops (self time under torch.profiler,
    mean of ``steps`` steps).  Only the GEMMs' own time is taken from the profiled steps: the profiler's
    cost per op falls on the rest, which is therefore the unprofiled step minus this."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in TORCH_GEMMS) / steps / 1e6


def bench_split(res, torch, cases, quick):
    """GEMMs and the rest of both one-thread steps, and the bound the GEMMs set on the step's ratio."""
    fig = res.figures["step, 1 thread, PyTorch eager"]
    ours, theirs = fig["ours_median_s"], fig["theirs_median_s"]
    gemm, floor = res.figures["gemm_in_step"], res.figures["profile"]["gemm_floor"]
    peer_gemm = peer_gemm_seconds(torch, cases["torch"], 1 if quick else 3)
    res.figures["split"] = {"ours_gemm_s": gemm, "peer_gemm_s": peer_gemm, "ours_rest_s": ours - gemm,
                            "peer_rest_s": theirs - peer_gemm, "ours_floor_s": floor, "bound": floor / theirs}
    rows = [["GEMMs, as they ran in the step", ms(gemm), ms(peer_gemm), ratio(gemm / peer_gemm)],
            ["the rest: step - GEMMs", ms(ours - gemm), ms(theirs - peer_gemm), ratio((ours - gemm) / (theirs - peer_gemm))],
            ["step (median of the rounds above)", ms(ours), ms(theirs), ratio(ours / theirs)],
            ["our GEMMs timed alone (the floor) / the peer's step: the lowest ratio reachable", ms(floor), "",
             ratio(floor / theirs)]]
    res.table("GEMMs and the rest: our one-thread step against PyTorch eager's (CPU seconds)",
              ["", "ours", "PyTorch eager", "ours / PyTorch"], rows,
              ["GEMMs in the step: ours, every precision.gemm call of the profiled steps (the projections', the "
               "output layer's and attention's batched products); PyTorch's, the self time of "
               f"{', '.join(TORCH_GEMMS)} under torch.profiler, mean of {1 if quick else 3} steps. The rest is "
               "each side's median step minus its GEMMs.",
               "The GEMMs' ratio is the machine's (numpy's BLAS against PyTorch's MKL on this CPU); the rest's is "
               "the engine's own. A step can go no lower than its GEMMs: the last row is the best ratio to eager "
               f"left on this machine if everything else took no time, and a {TARGET:.2f}x target needs the rest under "
               f"{ms(max(0.0, TARGET * theirs - floor))} even at the floor."])


def run(quick):
    torch, why_not = import_torch()
    trainer, cases, no_compile = step_cases(torch, QUICK_MODEL if quick else MODEL, "sgd", compiled=torch is not None)
    res = Result(why_not or no_compile)
    bench_against_torch(res, trainer, cases, torch, quick)
    bench_profile(res, trainer, quick)
    if torch is not None:
        bench_split(res, torch, cases, quick)
    return res
