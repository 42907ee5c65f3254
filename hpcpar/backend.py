"""The array backend: numpy on CPU, cupy on GPU, chosen once per process.

Every op is written against ``xp`` (the array module) so that the same line of math runs on either.
Selection: ``HPCPAR_BACKEND=numpy|cupy`` or ``use("cupy")`` before building a model.

Also here, because it decides what arrays hold: the dtype policy.  Which device a rank computes on,
and whether MPI can read device memory, is the communication side's business (comm/device.py).
"""
import os

import numpy as np

from hpcpar.runtime import UsageError

DTYPES = {"float32": np.float32, "float64": np.float64}
DEFAULT_DTYPE = "float32"

_state = {"name": None, "xp": None}


def use(name):
    """Select the array module for this process: "numpy" or "cupy". Returns the module."""
    if name == "numpy":
        _state.update(name="numpy", xp=np)
    elif name == "cupy":
        try:
            import cupy
        except ImportError as err:
            raise UsageError(f"backend 'cupy' asked for, but cupy cannot be imported ({err}); "
                             "install the gpu extra: pip install 'hpcpar[gpu]'") from None
        try:
            cupy.cuda.runtime.getDeviceCount()
        except Exception as err:  # noqa: BLE001 - any CUDA failure means no usable device
            raise UsageError(f"backend 'cupy' asked for, but no CUDA device is usable ({err})") from None
        _state.update(name="cupy", xp=cupy)
    else:
        raise UsageError(f"unknown backend {name!r}: choose numpy or cupy")
    return _state["xp"]


def xp():
    """The current array module (numpy unless HPCPAR_BACKEND or use() chose cupy)."""
    if _state["xp"] is None:
        use(os.environ.get("HPCPAR_BACKEND", "numpy"))
    return _state["xp"]


def name():
    xp()
    return _state["name"]


def array_module(a):
    """The module an array belongs to (numpy or cupy), without importing cupy needlessly. Asked of the
    array, not of the process's choice: a communicator may be handed device arrays in a numpy process."""
    if isinstance(a, np.ndarray):
        return np
    if is_device_array(a):
        import cupy
        return cupy
    return xp()


def is_device_array(a):
    return hasattr(a, "__cuda_array_interface__")


def to_numpy(a):
    """Copy to host (a no-op for numpy arrays). Only for I/O and tests, never inside a step."""
    return a.get() if is_device_array(a) else np.asarray(a)


def resolve_dtype(dtype):
    """'float32' | 'float64' | numpy dtype -> numpy dtype, with a clear error otherwise."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise UsageError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        return np.dtype(DTYPES[dtype])
    return np.dtype(dtype)


def scatter_add(target, index, values):
    """target[index[i]] += values[i] for every row i, repeats summed (embedding backward).

    numpy: sort the rows by index and sum runs with add.reduceat (much faster than np.add.at);
    cupy: cupyx.scatter_add, an atomic add on the device.  Sums in the target's dtype.
    """
    values = values.astype(target.dtype, copy=False)
    if is_device_array(target):
        import cupyx
        cupyx.scatter_add(target, index, values)
        return target
    order = np.argsort(index, kind="stable")
    sorted_index = index[order]
    starts = np.flatnonzero(np.r_[True, sorted_index[1:] != sorted_index[:-1]])
    target[sorted_index[starts]] += np.add.reduceat(values[order], starts, axis=0)
    return target
