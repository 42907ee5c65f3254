"""(gs) One training step of a GPT-2 124M-sized model on the GPU, in each precision, against PyTorch
eager on the same device; model FLOPs utilisation against the GPU's peak; and what staging costs.

* fp32, tf32 (``--tf32``: float32 GEMMs on TF32 tensor cores), fp16 (loss scaling) and bf16 (when the
  installed cupy has it): ``Trainer.step`` - forward, backward, clipping, AdamW - timed as a whole
  (every step ends with its one host copy, so the device has finished); PyTorch: the same model
  (hpcpar/tools/bench/torch_gpt.py) under ``torch.autocast`` with a GradScaler for fp16, ``allow_tf32`` for
  tf32.  MFU: model FLOPs (hpcpar/flops.py) per second over the data-sheet dense peak of that mode.
* staging: one (B, T, C) activation device -> pinned host -> device through hpcpar.comm's buffers.  A
  tp = 2 step on an MPI that is not CUDA-aware stages 4 such activations per layer (2 all-reduces
  forward, 2 backward) before MPI moves a byte: that cost against the tp = 1 step.

Without a GPU this benchmark skips - unless HPCPAR_GPU_CHECK_DRY_RUN=1, when the same code runs on
numpy with a tiny model (jobs/gpu_check.sh's dry run, so the script cannot rot).  Dry-run figures
measure nothing worth quoting.
"""
import os
import time

from hpcpar.tools.bench.common import Result, ms, pct, ratio

GPT2 = dict(model="gpt2", batch_size=8)                       # 124M parameters, 8 x 1024 tokens
TINY = dict(model="tiny", layers=2, hidden=64, heads=4, seq_len=32, vocab=64, batch_size=2)
MODES = ("fp32", "tf32", "fp16", "bf16")
# NVIDIA data sheets, dense tensor-core FLOP/s (no sparsity), by a word of the device's name.
_HOPPER = {"fp32": 67e12, "tf32": 495e12, "fp16": 989e12, "bf16": 989e12}
PEAKS = {"H100": _HOPPER, "H200": _HOPPER, "GH200": _HOPPER,
         "A100": {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12}}


def dry_run():
    return os.environ.get("HPCPAR_GPU_CHECK_DRY_RUN") == "1"


def best_seconds(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def ours(mode, dims, backend, repeat):
    """(model config, tokens per step, best step seconds) of Trainer.step in ``mode``."""
    from mpi4py import MPI

    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    cfg = TrainConfig(precision="fp32" if mode == "tf32" else mode, tf32=mode == "tf32", backend=backend,
                      steps=10 ** 6, warmup=1, progress=False, **dims)
    t = Trainer(cfg, MPI.COMM_SELF)
    counter = iter(range(10 ** 6))
    t.step(next(counter))                                     # warm-up: allocations, kernels, the pool
    return t.mcfg, t.tokens_per_step, best_seconds(lambda: t.step(next(counter)), repeat)


def theirs(torch, mode, mcfg, batch, device, repeat):
    """Best seconds of the same step in PyTorch eager (autocast for fp16/bf16)."""
    from hpcpar.tools.bench.torch_gpt import Stage, loss_fn
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    low = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(mode)
    model = Stage(mcfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device, enabled=mode == "fp16")
    ids, targets = (torch.randint(0, mcfg.vocab_size, (batch, mcfg.seq_len), device=device) for _ in range(2))

    def step():
        with torch.autocast(device_type=device, dtype=low or torch.float32, enabled=low is not None):
            loss = loss_fn(model(ids), targets)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        loss.item()                                           # the host copy ours makes too
    step()
    return best_seconds(step, repeat)


def staging_round_trip(xp, shape, repeat):
    """Best seconds of one float32 activation to pinned host memory and back (numpy: two copies)."""
    import numpy as np
    x = xp.zeros(shape, dtype=np.float32)
    if xp is np:
        h = np.empty_like(x)
        return best_seconds(lambda: (np.copyto(h, x), np.copyto(x, h)), repeat)
    from hpcpar.comm.staging import Staging
    staging = Staging()

    def trip():
        staging.up(staging.down(x, "bench"), x)
        xp.cuda.get_current_stream().synchronize()
    return best_seconds(trip, repeat)


def run(quick):
    from hpcpar.tools.bench.common import import_torch
    from hpcpar.tools.bench.gpu import device_or_reason
    from hpcpar.flops import gpt_step_flops
    from hpcpar.gemm_speed import gemm_rate
    from hpcpar.precision import bfloat16
    res = Result()
    cupy, reason = device_or_reason()
    if cupy is None and not dry_run():
        res.table("GPU step", ["status"], [[reason + " (HPCPAR_GPU_CHECK_DRY_RUN=1 runs it on numpy)"]])
        res.figures = {"skipped": reason}
        return res
    import numpy as np
    on_gpu = cupy is not None
    xp, device = (cupy, "cuda") if on_gpu else (np, "cpu")
    dims, repeat = (TINY, 2) if quick or not on_gpu else (GPT2, 3)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode() if on_gpu else "CPU (dry run)"
    peaks = next((p for word, p in PEAKS.items() if word in name), None)
    if peaks is None:
        rate = gemm_rate("float32", n=256, seconds=0.1)       # dry run / unknown GPU: a measured stand-in
        peaks = dict.fromkeys(MODES, rate)
    torch, why_not = import_torch()
    if torch is not None and on_gpu and not torch.cuda.is_available():
        torch, why_not = None, "this PyTorch has no CUDA"
    rows, figures = [], {}
    for mode in MODES:
        if mode == "tf32" and not on_gpu:
            rows.append([mode, "GPU only"] + ["-"] * 5)
            continue
        if mode == "bf16" and bfloat16(xp) is None:
            rows.append([mode, "this cupy has no bfloat16"] + ["-"] * 5)
            continue
        mcfg, tokens, mine = ours(mode, dims, "cupy" if on_gpu else "numpy", repeat)
        if mode == "tf32":
            from hpcpar.precision import allow_tf32
            allow_tf32(cupy, False)                           # the modes after this one: as before
        flops = gpt_step_flops(mcfg, tokens)
        fig = figures[mode] = {"ours_s": mine, "flops": flops, "peak": peaks[mode], "mfu": flops / mine / peaks[mode]}
        row = [mode, ms(mine), f"{tokens / mine:,.0f}", pct(fig["mfu"])]
        try:
            fig["torch_s"] = theirs(torch, mode, mcfg, dims["batch_size"], device, repeat) if torch else None
        except Exception as err:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
            fig["torch_error"] = f"{type(err).__name__}: {err}"
        t = fig.get("torch_s")
        row += [ms(t), pct(flops / t / peaks[mode]), ratio(mine / t)] if t else ["-", "-", "-"]
        rows.append(row)
    shape = (dims["batch_size"], mcfg.seq_len, mcfg.d_model)
    trip = staging_round_trip(xp, shape, repeat + 2)
    staged = 4 * mcfg.n_layer * trip
    step = figures["fp32"]["ours_s"]
    figures["staging"] = {"round_trip_s": trip, "bytes": 4 * int(np.prod(shape)), "tp2_step_staging_s": staged,
                          "tp1_step_s": step}
    res.table(f"One training step on {name}: {mcfg.n_layer} layers, hidden {mcfg.d_model}, {mcfg.n_head} heads, "
              f"vocabulary {mcfg.vocab_size}, {dims['batch_size']} x {mcfg.seq_len} tokens",
              ["precision", "ours", "tokens/s", "MFU", "PyTorch eager", "PyTorch MFU", "ours / PyTorch"], rows,
              ["MFU: model FLOPs per second over the dense peak of that precision "
               + ("(NVIDIA data sheet)." if on_gpu and name != "CPU (dry run)" else "(a measured GEMM rate here)."),
               "PyTorch: " + ("torch.autocast, GradScaler for fp16, allow_tf32 for tf32." if torch else why_not)]
              + (["Dry run on the CPU: the steps run, the figures mean nothing."] if not on_gpu else []))
    res.table("Staging (an MPI that is not CUDA-aware): what tp = 2 adds to a step",
              ["activation", "round trip", "4 x layers of them", "tp = 1 step (fp32)", "share"],
              [[f"{shape}, float32", ms(trip), ms(staged), ms(step), pct(staged / step)]],
              ["Copies only, before MPI moves a byte; CUDA-aware MPI avoids them."])
    res.figures = dict(figures, device=name, dims=dims, dry_run=not on_gpu)
    return res
