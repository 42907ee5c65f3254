"""The C GEMM libraries hpcpar can call, each loaded through ctypes from where pip puts it.

    mkl      Intel oneMKL (the ``mkl`` wheel: libmkl_rt): cblas_sgemm, cblas_gemm_bf16bf16f32 (bf16
             inputs, fp32 accumulation and output; AMX or AVX512-BF16 on Intel CPUs - on other CPUs it
             runs a generic path), cblas_gemm_f16f16f32 (AVX512-FP16 / AMX-FP16)
    onednn   oneDNN (the ``onednn-cpu-gomp`` wheel: libdnnl, GNU OpenMP): dnnl_sgemm and
             dnnl_gemm_bf16bf16f32, whose kernels are chosen by CPU feature (AVX512-BF16 on AMD Zen 4
             and Intel alike)

Both are row-major BLAS (``native.Kernel``).  A wheel's shared libraries land in ``<prefix>/lib`` (a
venv's own lib/), which is not on the loader's path, so that directory is tried first, then the
loader's own search (a system-wide install).  ``load`` returns None when the library is not there.
"""
import ctypes
import sys
from pathlib import Path

import numpy as np

from hpcpar.blas.native import Kernel, bind

C_INT, C_LONG, C_CHAR = ctypes.c_int, ctypes.c_int64, ctypes.c_char


def _open(names):
    for name in names:
        for path in (Path(sys.prefix) / "lib" / name, name):
            try:
                return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
    return None


class Library:
    """A loaded GEMM library: ``kernels`` {dtype: Kernel}, its version, and its thread switch."""

    def __init__(self, name, version, kernels, set_threads):
        self.name, self.version, self.kernels, self._set_threads = name, version, kernels, set_threads

    def set_threads(self, n):
        self._set_threads(int(n))


MKL_ROW_MAJOR, MKL_N, MKL_T = 101, 111, 112
MKL_THREADING_GNU = 3       # MKL_Set_Threading_Layer: threads from GNU OpenMP (libgomp), as oneDNN's


def load_mkl(threads):
    lib = _open(["libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"])
    if lib is None:
        return None
    lib.MKL_Set_Threading_Layer(MKL_THREADING_GNU)          # before any other call into MKL
    lib.MKL_Set_Num_Threads(int(threads))
    text = ctypes.create_string_buffer(256)
    lib.MKL_Get_Version_String(text, len(text))
    version = "oneMKL " + text.value.decode().split("Version ")[-1].split("-")[0]           # "oneMKL 2026.2"
    flags, prefix = {False: MKL_N, True: MKL_T}, (MKL_ROW_MAJOR,)
    import ml_dtypes
    kernels = {np.dtype(dtype): Kernel(bind(lib, symbol, C_INT, C_INT, prefix=(C_INT,)), dtype, flags, prefix)
               for dtype, symbol in ((np.float32, "cblas_sgemm"), (ml_dtypes.bfloat16, "cblas_gemm_bf16bf16f32"),
                                     (np.float16, "cblas_gemm_f16f16f32"))}
    return Library("mkl", version, kernels, lambda n: lib.MKL_Set_Num_Threads(n))


class _DnnlVersion(ctypes.Structure):
    _fields_ = [("major", C_INT), ("minor", C_INT), ("patch", C_INT), ("hash", ctypes.c_char_p)]


def load_onednn(threads):
    lib = _open(["libdnnl.so.3", "libdnnl.so"])
    if lib is None:
        return None
    lib.dnnl_version.restype = ctypes.POINTER(_DnnlVersion)
    v = lib.dnnl_version().contents
    gomp = ctypes.CDLL("libgomp.so.1")                       # oneDNN's OpenMP: its thread count
    gomp.omp_set_num_threads(int(threads))
    import ml_dtypes
    flags = {False: b"N", True: b"T"}
    kernels = {np.dtype(dtype): Kernel(bind(lib, symbol, C_CHAR, C_LONG, restype=C_INT), dtype, flags)
               for dtype, symbol in ((np.float32, "dnnl_sgemm"), (ml_dtypes.bfloat16, "dnnl_gemm_bf16bf16f32"))}
    return Library("onednn", f"oneDNN {v.major}.{v.minor}.{v.patch}", kernels,
                   lambda n: gomp.omp_set_num_threads(n))


LOADERS = {"mkl": load_mkl, "onednn": load_onednn}
