"""The GEMM provider: which library multiplies the host's float32 and bf16/fp16 matrices in this run.

    numpy    numpy's own BLAS (OpenBLAS in the wheels).  Low precision is emulated: the bf16/fp16
             inputs cast to float32 and multiplied there - the same numbers a matrix unit gives (fp32
             accumulation), at fp32's speed less the casts.
    mkl      oneMKL through ctypes (``make install GEMM=mkl``): sgemm, and bf16 on AMX / AVX512-BF16
             (Intel only: MKL runs a generic path on other vendors' CPUs), fp16 on AVX512-FP16 / AMX-FP16.
    onednn   oneDNN through ctypes (``make install``'s default on x86-64 Linux): sgemm, and bf16 on
             AVX512-BF16 whatever the vendor (AMD Zen 4, Intel Cooper Lake and later).
    cupy     on a GPU, CuPy's matmul (cuBLAS) - decided by the arrays, not here (precision.gemm).

Every provider takes float32 or low-precision inputs and gives the float32 accumulator; rounding it to
the low precision, and which numbers live in which dtype at all, is precision.py's business.  float64
is numpy's always (the exactness tests' dtype).

Which one a run uses: ``--gemm NAME`` (``TrainConfig.gemm``), else ``$HPCPAR_GEMM``, else ``auto``:
- fp32 runs keep numpy's BLAS: the libraries' sgemm were within 10% of it on both benchmark CPUs
  (docs/performance.md), not worth changing every fp32 run's round-off for;
- bf16/fp16 runs take the fastest of numpy's emulation and each installed library with a kernel for
  the dtype, on a CPU whose flags show the matrix unit for it (``UNITS``), in a short probe (``probe``:
  a few 512 x 512 x 1536 products each, alternating); a library must beat the emulation by
  ``MARGIN`` to be taken, so that a noisy probe does not flip a run's choice.
The training run makes the choice on rank 0 and every rank uses it (training/step.py); the summary's
``gemm`` line names it and why.
"""
import os
import time
from pathlib import Path

import numpy as np

from hpcpar.blas.libraries import LOADERS
from hpcpar.runtime import UsageError

NAMES = ("auto", "numpy", "mkl", "onednn")
ENV = "HPCPAR_GEMM"
MARGIN = 1.2
# the CPU flags (/proc/cpuinfo) that show a matrix unit for a dtype
UNITS = {"bfloat16": ("amx_bf16", "avx512_bf16"), "float16": ("amx_fp16", "avx512_fp16")}
# The CPU flags that decide which kernels BLAS and numpy's SIMD loops can use (the bench's machine table).
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16",
              "amx_tile", "amx_bf16", "amx_fp16", "asimd", "sve", "sve2")


def cpu_flags(names=SIMD_FLAGS):
    """The flags of ``names`` this CPU reports (/proc/cpuinfo), in that order."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return [f for f in names if f in have]
    except OSError:
        pass
    return []


class Provider:
    """numpy's BLAS, or a ``libraries.Library``'s kernels (numpy's for a dtype it has none for)."""

    def __init__(self, name, library=None):
        self.name, self.library = name, library
        self.kernels = library.kernels if library else {}

    def native(self, dtype):
        """Whether this provider has its own kernel for ``dtype`` (numpy: float32 only)."""
        return np.dtype(dtype) in self.kernels or (self.library is None and np.dtype(dtype) == np.float32)

    def matmul(self, a, b, out=None, add=False):
        """a @ b for float32 or low-precision a, b (the same dtype): the float32 result, in ``out`` if given
        (``add``: out += a @ b)."""
        if a.dtype != np.float32 and a.dtype not in self.kernels:     # emulated: fp32 inputs and accumulation
            a, b = a.astype(np.float32), b.astype(np.float32)
        kernel = self.kernels.get(a.dtype)
        if kernel is None or a.ndim < 2 or b.ndim < 2:
            if add:
                out += np.matmul(a, b)
                return out
            return np.matmul(a, b, out=out)
        if out is None:
            out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), np.float32)
        return kernel(a, b, out, add)

    def set_threads(self, n):
        if self.library:
            self.library.set_threads(n)

    def describe(self):
        return "numpy's BLAS" if self.library is None else self.library.version


NUMPY = Provider("numpy")
_loaded = {"numpy": NUMPY}
_state = {"provider": NUMPY, "why": "the default"}
_probed = {}                # (dtype, candidates) -> the probe's seconds


def load(name, threads=None):
    """The provider ``name``, loaded once per process; UsageError if its library is not installed."""
    if name not in _loaded:
        if name not in LOADERS:
            raise UsageError(f"--gemm must be one of {', '.join(NAMES)}, not {name!r}")
        library = None
        try:
            library = LOADERS[name](threads or _threads())
        except (OSError, AttributeError, ImportError):
            pass                                    # a library without the symbols hpcpar calls
        if library is None:
            raise UsageError(f"--gemm {name}: its library is not installed (make install GEMM={name}, "
                             "docs/performance.md)")
        _loaded[name] = Provider(name, library)
    return _loaded[name]


def installed():
    """The providers whose libraries load here, numpy first."""
    found = [NUMPY]
    for name in LOADERS:
        try:
            found.append(load(name))
        except UsageError:
            pass
    return found


def _threads():
    from hpcpar import launch
    return launch.threads[0] if launch.threads and isinstance(launch.threads[0], int) else 1


def requested(name=""):
    """The name asked for: ``name`` (a flag), else $HPCPAR_GEMM, else auto."""
    return name or os.environ.get(ENV, "") or "auto"


def choose(name, dtype):
    """(provider, why) for a run whose GEMMs take ``dtype`` on the host: the one asked for, or auto's."""
    name = requested(name)
    if name != "auto":
        return load(name), "asked for (--gemm or $" + ENV + ")"
    dtype = np.dtype(dtype)
    if dtype.itemsize != 2:
        return NUMPY, f"auto: {dtype} runs keep numpy's BLAS"
    units = cpu_flags(UNITS.get(dtype.name, ()))
    candidates = [p for p in installed()[1:] if p.native(dtype)]
    if not units or not candidates:
        what = "no library with a kernel for it installed" if units else f"this CPU has no {dtype.name} unit"
        return NUMPY, f"auto: {dtype.name} emulated in fp32, {what}"
    key = (dtype.name, tuple(p.name for p in candidates))
    if key not in _probed:                          # once per process: a test suite builds many runs
        _probed[key] = probe([NUMPY] + candidates, dtype)
    seconds = _probed[key]
    best = min(candidates, key=lambda p: seconds[p.name])
    speedup = seconds["numpy"] / seconds[best.name]
    if speedup < MARGIN:
        return NUMPY, f"auto: {dtype.name} emulated in fp32 ({best.name} only {speedup:.2f}x it in a probe)"
    return best, f"auto: {dtype.name} on {'/'.join(units)}, {speedup:.1f}x numpy's emulation in a probe"


def probe(providers, dtype, shape=(512, 512, 1536), rounds=3):
    """{name: best seconds} of an (M, K) x (K, N) product in ``dtype``, the providers in turn, round after round."""
    M, K, N = shape
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s, dtype=np.float32).astype(dtype) for s in ((M, K), (K, N)))
    out = np.empty((M, N), np.float32)
    best = {p.name: float("inf") for p in providers}
    for r in range(rounds + 1):                    # round 0 untimed: page faults, the libraries' buffers
        for p in providers:
            start = time.process_time()
            p.matmul(a, b, out)
            if r:
                best[p.name] = min(best[p.name], time.process_time() - start)
    return best


def use(provider, why=""):
    """Make ``provider`` the one precision.gemm calls from now on, for this process."""
    _state.update(provider=provider, why=why)
    return provider


def provider():
    return _state["provider"]


def summary():
    """One line for the run's summary: the provider, its library, and why it was chosen."""
    p = _state["provider"]
    return f"{p.name} ({p.describe()}): {_state['why']}"
