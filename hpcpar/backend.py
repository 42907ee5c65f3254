"""The array backend: numpy on CPU, cupy on GPU, chosen once per process.

Every op is written against ``xp`` (the array module) so that the same line of math runs on either.
Selection: ``HPCPAR_BACKEND=numpy|cupy`` or ``use("cupy")`` before building a model.

Also here, because they decide where arrays live: the dtype policy, one device per node-local rank,
and whether the MPI library can read device memory directly (CUDA-aware).
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


# --- one device per rank -----------------------------------------------------------------------

def node_local_comm(comm):
    """The ranks of ``comm`` that share this node (and so its devices)."""
    from mpi4py import MPI
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)


def select_device(comm, allow_sharing=False):
    """Bind this rank to one GPU: its rank among the ranks of its node picks the device.

    The node-local rank comes from MPI itself (ranks that share memory), which is right under any
    launcher - srun, or mpiexec inside an allocation, where every rank inherits its launcher's
    SLURM_LOCALID.  More ranks than devices on a node is refused unless ``allow_sharing`` or
    HPCPAR_SHARE_GPU=1 (ranks then share devices round-robin, as the tests do on a one-GPU machine).
    """
    import cupy
    local = node_local_comm(comm)
    local_rank, local_size = local.rank, local.size
    local.Free()
    n_dev = cupy.cuda.runtime.getDeviceCount()
    allow_sharing = allow_sharing or os.environ.get("HPCPAR_SHARE_GPU") == "1"
    if local_size > n_dev and not allow_sharing:
        raise UsageError(f"{local_size} ranks on this node but {n_dev} GPU(s); start one rank per GPU "
                         "or set HPCPAR_SHARE_GPU=1 to share")
    device = local_rank % n_dev
    cupy.cuda.Device(device).use()
    return device


def cuda_aware_mpi():
    """Can the MPI library read and write device buffers directly?

    ``HPCPAR_CUDA_AWARE=0|1`` decides when set; otherwise ask MPI (MPI.Query_cuda_support, an
    MPICH/Open MPI extension exposed by mpi4py 4) and assume "no" when it cannot tell.
    """
    forced = os.environ.get("HPCPAR_CUDA_AWARE")
    if forced in ("0", "1"):
        return forced == "1"
    if forced is not None:
        raise UsageError(f"HPCPAR_CUDA_AWARE must be 0 or 1, not {forced!r}")
    try:
        from mpi4py import MPI
        return bool(MPI.Query_cuda_support())
    except (AttributeError, NotImplementedError, ImportError):
        return False
