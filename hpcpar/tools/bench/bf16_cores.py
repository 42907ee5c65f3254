"""(bf2) bf16 on the whole machine: hpcpar's 2-rank layouts against PyTorch on 2 threads, and bf16 on real text.

1. The bf16 step of the step benchmark's GPT (hidden 512) on 2 ranks, data-parallel (dp 2) and
   tensor-parallel (tp 2), each ``mpiexec -n 2 hpcpar train --precision bf16`` job one round (its
   summary's median step, wall seconds), against PyTorch's autocast bf16 step with 2 intra-op threads in
   this process; alternating, >= 5 rounds; the best layout's median ratio is the figure.
2. ``hpcpar train`` on real text (data/sample.txt, the own-data chapter's run: BPE vocabulary 512, 150
   steps) in fp32 and in bf16: the final validation losses, which should agree within 1%.
"""
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hpcpar.tools.bench.bf16_step import autocast_case, dims
from hpcpar.tools.bench.common import PEER_ROUNDS, Result, import_torch, ms, ratio
from hpcpar.tools.bench.engine import step_cases
from hpcpar.tools.bench.machine import set_blas_threads
from hpcpar.launch import first_error, mpiexec, run_job

LAYOUTS = {"dp 2": ["--dp", "2"], "tp 2": ["--tp", "2", "--dp", "1"]}
TARGET, TEXT_TARGET = 0.85, 0.01
SAMPLE = Path(__file__).resolve().parents[3] / "data" / "sample.txt"
TEXT_RUN = ["--seq-len", "64", "--batch-size", "16", "--steps", "150", "--lr", "3e-3", "--eval-every", "50",
            "--eval-batches", "4"]


def model_flags(hidden, quick):
    d = dims(hidden, quick)
    return ["--model", "small", "--untied", "--optimizer", "sgd", "--hidden", str(hidden), "--ffn", str(d["ffn"]),
            "--layers", str(d["layers"]), "--heads", str(d["heads"]), "--seq-len", str(d["seq_len"]),
            "--vocab", str(d["vocab"]), "--batch-size", str(d["batch_size"])]


def hpcpar_job(args, tmp, tag, ranks=1):
    """Run ``hpcpar train ARGS`` (on ``ranks`` ranks); its summary JSON and its metrics records."""
    summary, metrics, log = (Path(tmp) / f"{tag}.{ext}" for ext in ("json", "jsonl", "log"))
    cmd = [sys.executable, "-m", "hpcpar", "train", *args, "--no-progress", "--summary-json", str(summary),
           "--metrics", str(metrics)]
    status, _ = run_job((mpiexec() + ["-n", str(ranks)] if ranks > 1 else []) + cmd, log, 1200)
    if status != 0:
        raise RuntimeError(f"{tag}: {first_error(log)}")
    gemm = next((line.split("gemm", 1)[1].strip() for line in log.read_text().splitlines()
                 if line.strip().startswith("gemm")), "")
    return json.loads(summary.read_text()), [json.loads(line) for line in metrics.read_text().splitlines()], gemm


def bench_two_cores(res, torch, tmp, quick):
    hidden = 32 if quick else 512
    steps, rounds = (3, 2) if quick else (6, PEER_ROUNDS)
    flags = model_flags(hidden, quick) + ["--precision", "bf16", "--steps", str(steps)]
    times, gemm = {name: [] for name in LAYOUTS}, ""
    if torch is not None:
        trainer, _, _ = step_cases(None, dims(hidden, quick), "sgd")
        peer = autocast_case(torch, trainer)
        times["torch"] = []
        peer()

    def torch_round():
        torch.set_num_threads(2)
        set_blas_threads(2)
        per = []
        for _ in range(steps):
            start = time.perf_counter()
            peer()
            per.append(time.perf_counter() - start)
        torch.set_num_threads(1)
        set_blas_threads(1)
        return statistics.median(per[1:] or per)

    names = list(times)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name == "torch":
                times[name].append(torch_round())
            else:
                summary, _, gemm = hpcpar_job(flags + LAYOUTS[name], tmp, f"{name}-{r}", ranks=2)
                times[name].append(summary["step_time_s"])
    rows, best = [], None
    for name in LAYOUTS:
        row = [name, ms(statistics.median(times[name]))]
        if torch is not None:
            paired = [a / b for a, b in zip(times[name], times["torch"])]
            fig = {"ours_median_s": statistics.median(times[name]), "theirs_median_s": statistics.median(times["torch"]),
                   "ratio_median_paired": statistics.median(paired), "ratio_min": min(paired),
                   "ratio_max": max(paired), "rounds": len(paired)}
            res.figures[f"2 cores, bf16, {name}"] = fig
            best = fig if best is None or fig["ratio_median_paired"] < best["ratio_median_paired"] else best
            row += [ms(fig["theirs_median_s"]), f"{fig['ratio_median_paired']:.2f}x ({fig['ratio_min']:.2f}-"
                                                f"{fig['ratio_max']:.2f}, {fig['rounds']} rounds)"]
        rows.append(row)
    if best is not None:
        res.target("2 cores, bf16: hpcpar's best 2-rank layout / PyTorch autocast on 2 threads", f"<= {TARGET:.2f}x",
                   ratio(best["ratio_median_paired"]), best["ratio_median_paired"] <= TARGET)
    res.table(f"bf16 on the whole machine: 2 ranks against PyTorch autocast on 2 threads (hidden {hidden}, wall "
              "seconds a step)", ["layout", "ours (median)", "PyTorch, 2 threads (median)",
                                  "ours / PyTorch: median of the rounds (range)"], rows,
              [f"Each round one `mpiexec -n 2 hpcpar train --precision bf16 ... --steps {steps}` job per layout "
               "(its summary's median step) and PyTorch's step the same number of times (median, the first "
               f"left out); ranks run one thread each. GEMMs: {gemm}."])


def bench_text(res, tmp, quick):
    from hpcpar.training.text import prepare
    steps = ["--steps", "20", "--eval-every", "10"] if quick else []
    data = Path(tmp) / "sample"
    prepare([str(SAMPLE)], str(data), vocab_size=512, progress=False)
    rows, val = [], {}
    for precision in ("fp32", "bf16"):
        summary, records, gemm = hpcpar_job(["--data", str(data), *TEXT_RUN, *steps, "--precision", precision], tmp,
                                            f"text-{precision}")
        val[precision] = [r["val_loss"] for r in records if "val_loss" in r][-1]
        rows.append([precision, f"{summary['loss']:.4f}", f"{val[precision]:.4f}", ms(summary["step_time_s"]), gemm])
    gap = val["bf16"] / val["fp32"] - 1
    res.figures["text"] = {"val_loss": val, "relative_gap": gap}
    res.target("bf16 on real text: final validation loss against fp32's", f"within {100 * TEXT_TARGET:.0f}%",
               f"{100 * gap:+.2f}%", abs(gap) <= TEXT_TARGET)
    res.table("bf16 against fp32 on real text: `hpcpar train --data runs/sample " + " ".join(TEXT_RUN) +
              " --precision fp32|bf16` (data/sample.txt, BPE vocabulary 512)",
              ["precision", "last training loss", "final validation loss", "step (median)", "GEMMs"], rows,
              [f"bf16's validation loss is {100 * gap:+.2f}% from fp32's."])


def run(quick):
    torch, why_not = import_torch()
    res = Result(why_not)
    with tempfile.TemporaryDirectory(prefix="hpcpar-bench-bf16-") as tmp:
        bench_two_cores(res, torch, tmp, quick)
        bench_text(res, tmp, quick)
    return res
