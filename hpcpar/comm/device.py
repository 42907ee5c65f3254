"""Device binding: one GPU per rank, and whether the MPI library can read device memory directly.

Both questions need MPI (which ranks share a node; what the MPI library supports), so they live
beside the communicators; the array backend (backend.py) stays free of MPI.
"""
import os

from hpcpar.runtime import UsageError


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
