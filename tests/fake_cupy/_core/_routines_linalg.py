"""``cupy._core._routines_linalg`` of the stand-in: the cuBLAS compute type per dtype, recorded.

CuPy names the compute types with these constants; ``set_compute_type(dtype, COMPUTE_TYPE_TF32)`` is
the in-process form of CUPY_TF32=1.  Here the choice is only recorded (numpy has no TF32)."""
import numpy as np

from fake_cupy.cuda import record

COMPUTE_TYPE_DEFAULT = 1
COMPUTE_TYPE_TF32 = 7


def set_compute_type(dtype, compute_type):
    record.compute_types[np.dtype(dtype).name] = compute_type
