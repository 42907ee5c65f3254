"""The machine a benchmark ran on: CPU, BLAS and its settings, MPI, PyTorch - what a reader needs to
judge the numbers, collected without starting MPI (mpi4py is imported with initialisation off).

The BLAS rows matter most: numpy's OpenBLAS picks its kernel at run time from the CPU unless
``OPENBLAS_CORETYPE`` names one (a Haswell kernel on a newer CPU runs at about two thirds of the
speed), and PyTorch's MKL has its own switches; every such variable is listed as it was.
"""
import ctypes
import glob
import os
import platform
import sys
from pathlib import Path

from hpcpar.blas import cpu_flags

# Environment variables that change how fast BLAS, OpenMP or MPI run: listed whatever their value.
BLAS_ENV_PREFIXES = ("OPENBLAS_", "MKL_", "OMP_", "GOTO", "KMP_", "NVPL_", "BLIS_", "MPIR_CVAR_")


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gemm_providers():
    """The GEMM libraries installed for hpcpar (hpcpar/blas) and the bf16 choice auto makes here."""
    from hpcpar import blas
    installed = ", ".join(f"{p.name} ({p.describe()})" for p in blas.installed())
    try:
        import ml_dtypes
    except ImportError:
        return installed + "; no bf16 (ml_dtypes is not installed)"
    chosen, why = blas.choose("auto", ml_dtypes.bfloat16)
    return installed + f"; a bf16 run's auto choice: {chosen.name} ({why})"


def gemm_rates():
    """'float32 ..., float64 ... GFLOP/s': numpy's square 1024 GEMM on one thread, best of 0.3 s of CPU
    time each - the figure that moves every GEMM-bound row from one machine to another."""
    import time

    from hpcpar.gemm_speed import gemm_rate
    set_blas_threads(1)
    return ", ".join(f"{dtype} {gemm_rate(dtype, n=1024, seconds=0.3, clock=time.process_time) / 1e9:.0f}"
                     for dtype in ("float32", "float64")) + " GFLOP/s"


def _openblas(name):
    """numpy's OpenBLAS function ``name`` (under any of its builds' prefixes and suffixes), or None."""
    import numpy as np
    libs = glob.glob(str(Path(np.__file__).parent.parent / "numpy.libs" / "*openblas*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for symbol in (f"scipy_openblas_{name}64_", f"scipy_openblas_{name}", f"openblas_{name}64_",
                       f"openblas_{name}"):
            fn = getattr(lib, symbol, None)
            if fn is not None:
                return fn
    return None


def openblas_core():
    """The kernel OpenBLAS chose at run time (e.g. 'SkylakeX', 'Haswell'), or None if not found."""
    fn = _openblas("get_corename")
    if fn is None:
        return None
    fn.restype = ctypes.c_char_p
    return fn().decode()


def set_blas_threads(n):
    """Let numpy's OpenBLAS, and the run's GEMM library (hpcpar/blas), use ``n`` threads from now on (the
    benchmarks start with one); False if this numpy's BLAS offers no such switch."""
    from hpcpar import blas
    blas.provider().set_threads(n)
    fn = _openblas("set_num_threads")
    if fn is not None:
        fn(int(n))
    return fn is not None


def numpy_blas():
    import numpy as np
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001 - older numpy: the name is enough
        return "unknown"


def mpi_library():
    import mpi4py
    mpi4py.rc.initialize = False            # MPI_Get_library_version is allowed before MPI_Init
    from mpi4py import MPI
    return " ".join(MPI.Get_library_version().split("\n")[0].split()), mpi4py.__version__


def torch_description():
    try:
        import torch
    except ImportError:
        return "not installed (the PyTorch rows are skipped)"
    blas = "MKL" if torch.backends.mkl.is_available() else "no MKL"
    return (f"{torch.__version__} ({blas}, CPU capability {torch.backends.cpu.get_cpu_capability()}; "
            "1 intra-op thread in every benchmark)")


def cupy_description():
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode() if n else "no device"
        return f"cupy {cupy.__version__}, {n} device(s): {name}"
    except Exception as err:  # noqa: BLE001 - ImportError or any CUDA failure: no GPU section
        return f"none ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'unavailable'})"


def describe(launcher, env):
    """[(what, value)] rows for BENCHMARKS.md and the JSON; ``env``: the benchmarks' environment."""
    import numpy as np
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    mpi, mpi4py_version = mpi_library()
    env = {"OPENBLAS_CORETYPE": env.get("OPENBLAS_CORETYPE", "(unset)"),      # first: it matters most
           **{k: v for k, v in sorted(env.items()) if k.startswith(BLAS_ENV_PREFIXES)}}
    return [
        ("CPU", f"{cpu_model()}, {cores} cores available, {memory:.0f} GiB memory"),
        ("CPU SIMD flags", " ".join(cpu_flags()) or "unknown"),
        ("GEMM providers (hpcpar/blas)", gemm_providers()),
        ("GEMM rate, one thread (numpy, 1024 x 1024 x 1024)", gemm_rates()),
        ("OS", platform.platform()),
        ("Python", sys.version.split()[0]),
        ("numpy", f"{np.__version__}, BLAS {numpy_blas()}, OpenBLAS kernel in use: {openblas_core() or 'unknown'}"),
        ("BLAS/OpenMP/MPI environment", ", ".join(f"{k}={v}" for k, v in env.items())),
        ("MPI", f"{mpi} (mpi4py {mpi4py_version}), launched as `{launcher} -n N`; ranks run with "
                f"MPIR_CVAR_CH4_PROGRESS_THROTTLE={env.get('MPIR_CVAR_CH4_PROGRESS_THROTTLE', 1)} "
                "(hpcpar's default under a launcher, hpcpar/runtime.py)"),
        ("PyTorch", torch_description()),
        ("GPU", cupy_description()),
    ]
