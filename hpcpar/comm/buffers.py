"""What MPI is handed for an array: in the common case the array itself, else a detour.

The common case - a numpy array of a type MPI knows - is decided by one set lookup, since it is
asked on every call and a 4 KB message spends only ~3.5 us inside MPI.  The detours:

* **bfloat16** has no MPI datatype: it travels as its bytes (a uint16 view) - fine for moving data,
  never for summing it (refused: sum low precision in float32, hpcpar/precision.py);
* **device memory** (cupy) goes to MPI as it is when MPI is CUDA-aware, after the current stream
  is synchronised so that MPI reads finished data; otherwise through a pinned host copy reused
  across steps (staging.py).  The staging copies show in a trace as their own spans.
"""
import numpy as np
from mpi4py import MPI

from hpcpar import backend
from hpcpar.comm.device import cuda_aware_mpi
from hpcpar.comm.staging import Staging

IN_PLACE = MPI.IN_PLACE
# numpy arrays of these types go to MPI as they are
PLAIN = frozenset(np.dtype(t) for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                        "uint64", "float16", "float32", "float64", "complex64", "complex128"))


def _wire(x):
    """bfloat16 as its bytes (uint16); any other array as it is."""
    return x.view(np.uint16) if x.dtype.name == "bfloat16" else x


def _summable(x):
    if x.dtype.name == "bfloat16":
        raise TypeError("MPI cannot reduce bfloat16: sum low precision in float32 (hpcpar.precision)")


class Buffers:
    """One communicator's way from arrays to MPI buffers (and its staging buffers, when needed)."""

    def __init__(self):
        self.staging = None             # made on the first device array that MPI cannot read
        self._cuda_aware = None

    def pair(self, x, y, slot, summed=False):
        """(what MPI reads, what MPI writes, what to run afterwards or None) for input x (or IN_PLACE)
        and output y; ``summed``: a reduction (bfloat16 refused)."""
        if type(y) is np.ndarray and y.dtype in PLAIN and \
                (x is IN_PLACE or (type(x) is np.ndarray and x.dtype in PLAIN)):
            return x, y, None
        if summed:
            _summable(y)
            if x is not IN_PLACE:
                _summable(x)
        recv, finish = self.writing(y, slot)
        if x is IN_PLACE:
            if finish:                               # staged: the host buffer starts with y's values
                self.staging.down(y, slot)
            return x, recv, finish
        return self.reading(x, slot + " in"), recv, finish

    def reading(self, x, slot):
        """A buffer MPI may read that holds x's values."""
        if type(x) is np.ndarray and x.dtype in PLAIN:
            return x
        if backend.is_device_array(x) and not self._device_direct():
            return _wire(self.staging.down(x, slot))
        return _wire(x)

    def writing(self, y, slot):
        """(buffer MPI may write, function that moves it into y afterwards - None when MPI writes y)."""
        if type(y) is np.ndarray and y.dtype in PLAIN:
            return y, None
        if backend.is_device_array(y) and not self._device_direct():
            h = self.staging.host(y, slot)
            return _wire(h), (lambda: self.staging.up(h, y))
        return _wire(y), None

    def _device_direct(self):
        """Whether device arrays may be passed to MPI as they are (a CUDA-aware MPI)."""
        if self._cuda_aware is None:
            self._cuda_aware = cuda_aware_mpi()
            self.staging = Staging()
        import cupy
        cupy.cuda.get_current_stream().synchronize()   # MPI must see finished kernels
        return self._cuda_aware
