"""(a) GEMM rate at the training shapes, against the BLAS peak of a large square GEMM.

The matrix multiplies of one GPT-2 block, forward and backward, at the engine benchmark's middle
shape (hidden 512, 8 sequences of 128 tokens, so N = 1024 rows), each with its operands laid out as
the ops hold them ("nt": the second operand is used transposed, as in dX = dY W^T; "tn": the first,
as in dW = X^T dY; attention's are batched over sequences x heads).  Each runs in float32 and float64
with numpy's BLAS, and in float32 with PyTorch's (its MKL: the library the engine benchmark (d) is
compared against), next to an n x n x n square product, the best case for any BLAS.

A shape at a high share of the square's rate is as fast as BLAS gets; a low share (the small
batched attention products) is time the engine spends below peak however the code is written.
"""
import numpy as np

from hpcpar.tools.bench.common import Result, import_torch, interleave, pct
from hpcpar.flops import Gemm

SHAPE = dict(hidden=512, batch=8, seq=128)         # the (d) benchmark's middle block
PEAK_N = 2048


def operands(gemm, dtype, seed=0):
    """numpy (a, b) laid out as the ops hold them; ``a @ b`` is the product."""
    g, rng = gemm, np.random.default_rng(seed)
    lead = (g.count,) if g.count > 1 else ()
    a = rng.standard_normal(lead + ((g.k, g.m) if g.layout == "tn" else (g.m, g.k)))
    b = rng.standard_normal(lead + ((g.n, g.k) if g.layout == "nt" else (g.k, g.n)))
    a, b = a.astype(dtype), b.astype(dtype)
    return (a.swapaxes(-1, -2) if g.layout == "tn" else a), (b.swapaxes(-1, -2) if g.layout == "nt" else b)


def block_gemms(hidden, batch, seq, heads=None, ffn=None):
    """The GEMMs of one transformer block's forward and backward (ops/linear.py, ops/attention.py)."""
    C, F, T = hidden, ffn or 4 * hidden, seq
    N, H = batch * seq, batch * (heads or hidden // 64)
    HS = C // (H // batch)
    linears = [("c_attn", C, 3 * C), ("attn.c_proj", C, C), ("c_fc", C, F), ("mlp.c_proj", F, C)]
    def core(name, m, k, n, layout="nn"):          # attention's products: no weights, one per head
        return Gemm(name, m=m, n=n, k=k, count=H, weight=False, layout=layout)
    forward = [Gemm(f"{name} forward", m=N, n=d_out, k=d_in) for name, d_in, d_out in linears]
    forward[1:1] = [core("attention Q K^T", T, HS, T, "nt"), core("attention P V", T, T, HS)]
    backward = [Gemm(f"{name} dX = dY W^T", m=N, n=d_in, k=d_out, layout="nt") for name, d_in, d_out in linears]
    backward += [Gemm(f"{name} dW = X^T dY", m=d_in, n=d_out, k=N, layout="tn") for name, d_in, d_out in linears]
    backward += [core("attention dV = P^T dO", T, T, HS, "tn"), core("attention dP = dO V^T", T, HS, T, "nt"),
                 core("attention dQ = dS K", T, T, HS), core("attention dK = dS^T Q", T, T, HS, "tn")]
    return forward + backward


def head_gemms(hidden, vocab, tokens):
    """The output layer's GEMMs (logits = h W^T with W (V, C)): forward, dh, dW."""
    return [Gemm("head forward", m=tokens, n=vocab, k=hidden, layout="nt"), Gemm("head dh", m=tokens, n=hidden, k=vocab),
            Gemm("head dW", m=vocab, n=hidden, k=tokens, layout="tn")]


def gemm_cases(gemms, dtype, torch=None):
    """name -> function running that GEMM once (numpy, or torch when given)."""
    cases = {}
    for g in gemms:
        a, b = operands(g, dtype)
        if torch is not None:
            a, b = torch.from_numpy(a), torch.from_numpy(b)       # the same (transposed) views
        cases[g.name] = (lambda a=a, b=b: a @ b)
    return cases


def time_gemms(gemms, rounds, torch=None, dtypes=("float32",)):
    """Best seconds of each GEMM: {(library, dtype, name): s}, all timed in one interleaved run."""
    cases = {}
    for dtype in dtypes:
        for name, fn in gemm_cases(gemms, dtype).items():
            cases[("numpy", dtype, name)] = fn
    if torch is not None:
        for name, fn in gemm_cases(gemms, "float32", torch).items():
            cases[("torch", "float32", name)] = fn
    return {key: min(ts) for key, ts in interleave(cases, rounds).items()}


def run(quick):
    torch, why_not = import_torch()
    shape = dict(hidden=64, batch=2, seq=32) if quick else SHAPE
    n = 256 if quick else PEAK_N
    square = Gemm(f"square {n} x {n} x {n} (peak)", n, n, n)
    gemms = block_gemms(**shape) + [square]
    best = time_gemms(gemms, 2 if quick else 5, torch, ("float32", "float64"))

    def gflops(lib, dtype, g):
        return g.flops / best[(lib, dtype, g.name)] / 1e9

    block = gemms[:-1]
    total = {(lib, dt): sum(g.flops for g in block) / sum(best[(lib, dt, g.name)] for g in block) / 1e9
             for lib, dt in (("numpy", "float32"), ("numpy", "float64"), ("torch", "float32")) if
             (lib, dt, block[0].name) in best}
    peak = {dt: gflops("numpy", dt, square) for dt in ("float32", "float64")}
    rows = []
    for g in gemms:
        row = [g.name, g.label(), g.layout]
        for dt in ("float32", "float64"):
            r = gflops("numpy", dt, g)
            row += [f"{r:.0f}", pct(r / peak[dt])]
        row += [f"{gflops('torch', 'float32', g):.0f}" if torch else "-"]
        rows.append(row)
    rows.insert(len(block), ["**whole block** (FLOP-weighted)", f"{sum(g.flops for g in block) / 1e9:.2f} GFLOP", ""]
                + [v for dt in ("float32", "float64") for v in (f"{total[('numpy', dt)]:.0f}",
                                                                pct(total[("numpy", dt)] / peak[dt]))]
                + [f"{total[('torch', 'float32')]:.0f}" if torch else "-"])
    res = Result()
    res.table(f"GEMMs of one block, hidden {shape['hidden']}, {shape['batch']} x {shape['seq']} tokens "
              "(GFLOP/s, CPU time, best of the interleaved rounds)",
              ["GEMM", "m x k x n", "layout", "numpy f32", "of f32 peak", "numpy f64", "of f64 peak", "torch f32"],
              rows, [why_not] if why_not else
              ["torch f32: the same products through PyTorch (MKL), for reference - the GEMM part of the "
               "engine-vs-PyTorch ratio in (d) is the ratio of these two libraries."])
    res.figures = {"shape": shape, "peak_gflops": peak, "block_gflops": {f"{k[0]} {k[1]}": v for k, v in total.items()},
                   "gflops": {f"{lib} {dt} {name}": (next(g for g in gemms if g.name == name).flops / s / 1e9)
                              for (lib, dt, name), s in best.items()}}
    return res
