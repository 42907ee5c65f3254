"""``cupyx`` of the stand-in: the scatter-add of the embedding backward, and pinned host memory."""
import numpy as np

from fake_cupy import PinnedArray, ndarray


def scatter_add(a, slices, value):
    """a[slices] += value with repeated indices summed (an atomic add on a real device)."""
    if not isinstance(a, ndarray) or not isinstance(slices, ndarray) or not isinstance(value, ndarray):
        raise TypeError("cupyx.scatter_add takes device arrays")
    np.add.at(a._a, slices._a, value._a)


def empty_pinned(shape, dtype=np.float64):
    """Page-locked host memory is a numpy array in CuPy too; marked so that copies into it count apart."""
    return np.empty(shape, dtype=dtype).view(PinnedArray)
