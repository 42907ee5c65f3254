"""(g) The GPU section: runs when cupy imports and sees a device; otherwise it says why it skipped.

On the device, timed with CUDA events (``cupyx.profiler.benchmark``: kernel time, not launch time):

* the GEMMs of one block at a GPU-sized shape (hidden 1024, 8 sequences of 512 tokens) in float32,
  against a 8192-square product (the device's practical peak);
* one block forward + backward with the engine on cupy (HPCPAR_BACKEND=cupy's code path), against
  the same block in PyTorch on CUDA when this PyTorch build has it.
"""
import time

from hpcpar.tools.bench.common import Result, ms, pct, ratio

SHAPE = dict(hidden=1024, batch=8, seq=512)
QUICK_SHAPE = dict(hidden=128, batch=2, seq=64)


def device_or_reason():
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # noqa: BLE001 - ImportError, or any CUDA failure: nothing to measure
        return None, f"skipped: no usable GPU ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    if n == 0:
        return None, "skipped: cupy sees no CUDA device"
    return cupy, None


def gpu_seconds(fn, repeat):
    """Best kernel time of fn on the current stream (CUDA events), after a warm-up."""
    from cupyx.profiler import benchmark
    return float(benchmark(fn, n_repeat=repeat, n_warmup=2).gpu_times.min())


def run(quick):
    cupy, reason = device_or_reason()
    res = Result()
    if cupy is None:
        res.table("GPU", ["status"], [[reason]])
        res.figures = {"skipped": reason}
        return res
    import numpy as np

    from hpcpar import backend
    from hpcpar.tools.bench.gemm import block_gemms, operands
    from hpcpar.flops import Gemm
    from hpcpar.tools.bench.engine import block_cases
    shape, repeat = (QUICK_SHAPE, 3) if quick else (SHAPE, 20)
    n = 1024 if quick else 8192
    gemms = block_gemms(**shape) + [Gemm(f"square {n} (peak)", n, n, n)]
    rates = {}
    for g in gemms:
        a, b = (cupy.asarray(m) for m in operands(g, "float32"))
        rates[g.name] = g.flops / gpu_seconds(lambda a=a, b=b: a @ b, repeat)
    peak = rates[gemms[-1].name]
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    res.table(f"GEMMs of one block on {name}, hidden {shape['hidden']}, {shape['batch']} x {shape['seq']} tokens, "
              "float32 (CUDA event time)", ["GEMM", "m x k x n", "TFLOP/s", "of the square's"],
              [[g.name, g.label(), f"{rates[g.name] / 1e12:.1f}", pct(rates[g.name] / peak)] for g in gemms])

    backend.use("cupy")                                   # parameters and activations on the device
    try:
        import torch
        has_torch_cuda = torch.cuda.is_available()
    except ImportError:
        torch, has_torch_cuda = None, False
    cases = block_cases(shape["hidden"], shape["batch"], shape["seq"], None)
    ours = gpu_seconds(cases["ours"], repeat)
    row = [str(shape["hidden"]), ms(ours)]
    if has_torch_cuda:
        from hpcpar.tools.bench.torch_gpt import Block
        from hpcpar.nn.gpt import GPTConfig
        cfg = GPTConfig(vocab_size=64, seq_len=shape["seq"], n_head=shape["hidden"] // 64, d_model=shape["hidden"])
        block = Block(cfg).cuda()
        x = torch.randn(shape["batch"], shape["seq"], shape["hidden"], device="cuda", requires_grad=True)
        dy = 0.1 * torch.randn_like(x)
        best = float("inf")
        for _ in range(repeat + 2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            block(x).backward(dy)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        row += [ms(best), ratio(ours / best)]
        res.figures["block"] = {"ours_s": ours, "torch_s": best}
    else:
        row += ["-", "-"]
        res.figures["block"] = {"ours_s": ours, "torch": "no CUDA in this PyTorch build"}
    res.table("One block forward + backward on the device", ["hidden", "ours (cupy)", "PyTorch (CUDA)", "ratio"],
              [row], [] if has_torch_cuda else ["PyTorch has no CUDA here: only our time is shown."])
    res.figures.update(gemm_flops=rates, device=name, dtype=str(np.float32))
    return res
