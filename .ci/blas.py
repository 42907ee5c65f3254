"""Print the OpenBLAS kernel numpy runs with and its thread count, e.g. "Haswell 1".

OPENBLAS_CORETYPE picks the kernel and OPENBLAS_NUM_THREADS the threads; this asks the library
numpy loaded (numpy's own OpenBLAS exports its functions with a prefix and suffix), so CI can check
that a setting took effect.  Prints "unknown" for a BLAS that is not OpenBLAS.
"""
import ctypes

import numpy  # noqa: F401 - loads the BLAS

libraries = sorted({line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line.lower()})


def call(library, name, restype):
    for symbol in (f"scipy_{name}64_", f"{name}64_", name):
        function = getattr(library, symbol, None)
        if function is not None:
            function.restype = restype
            return function()
    return None


if not libraries:
    print("unknown")
else:
    blas = ctypes.CDLL(libraries[0])
    core = call(blas, "openblas_get_corename", ctypes.c_char_p)
    threads = call(blas, "openblas_get_num_threads", ctypes.c_int)
    print(core.decode() if core else "unknown", threads)
