"""Tensor, pipeline and data parallelism on the device (a GPU, or the CuPy stand-in): the same float64
losses as numpy, device buffers through hpcpar.comm staged or CUDA-aware, one host copy per step.

With the stand-in, "CUDA-aware" hands MPI the pointer of ``__cuda_array_interface__``, which is host
memory there, so every line of the CUDA-aware path runs on an ordinary MPI.  On a real GPU that mode
needs an MPI built with CUDA and is skipped otherwise.  Ranks share the device (HPCPAR_SHARE_GPU=1),
except on the stand-in at 8 ranks, which reports one device per rank to check the binding."""
import numpy as np
import pytest

from gpu_helpers import CopyCounter, device_module, is_stand_in
from hpcpar import backend
from hpcpar.comm import Communicator
from train_helpers import free, rel_err, trainer

pytestmark = pytest.mark.gpu


@pytest.fixture
def cupy(monkeypatch):
    cp = device_module(monkeypatch)
    monkeypatch.setenv("HPCPAR_SHARE_GPU", "1")
    yield cp
    backend.use("numpy")


def cuda_aware(cupy, monkeypatch, aware):
    from mpi4py import MPI
    if aware == "1" and not is_stand_in(cupy) and not getattr(MPI, "Query_cuda_support", lambda: False)():
        pytest.skip("this MPI is not CUDA-aware")
    monkeypatch.setenv("HPCPAR_CUDA_AWARE", aware)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("aware", ["0", "1"])
def test_collectives_on_device_buffers(comm, cupy, monkeypatch, aware):
    cuda_aware(cupy, monkeypatch, aware)
    c = Communicator(comm, "gpu")
    x = cupy.arange(10, dtype=cupy.float64) + comm.rank
    want = np.arange(10) * comm.size + sum(range(comm.size))
    np.testing.assert_allclose(cupy.asnumpy(c.all_reduce(x)), want)
    np.testing.assert_allclose(cupy.asnumpy(c.all_gather(x)), np.concatenate([np.arange(10) + r
                                                                             for r in range(comm.size)]))
    y = x.copy()
    np.testing.assert_allclose(cupy.asnumpy(c.all_reduce_(y)), want)
    assert (c.staging_bytes > 0) == (aware == "0")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("layout", [dict(tp=2), dict(pp=2, microbatches=2), dict(dp=2),
                                    dict(tp=2, sequence_parallel=True), dict(cp=2)],
                         ids=["tp2", "pp2", "dp2", "tp2sp", "cp2"])
def test_layouts_on_the_device_match_numpy(comm, cupy, layout):
    sub = comm.Split(comm.rank // 2, comm.rank)
    runs = {}
    for name in ("numpy", "cupy"):
        t = trainer(sub, backend=name, **layout)
        runs[name] = [t.step(s).loss for s in range(2)]
        free(t)
    sub.Free()
    # float64, other kernels and reduction orders on a GPU: 1e-10 relative, not bit for bit
    assert rel_err(runs["cupy"], runs["numpy"]) <= 1e-10


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("aware", ["0", "1"], ids=["staged", "cuda-aware"])
def test_3d_on_the_device_matches_one_rank(comm, cupy, monkeypatch, aware):
    """2 x 2 x 2 on 8 ranks (ZeRO-1, tied embedding split over the pipeline) on the device against one
    numpy rank; afterwards a step's host copies: the agreed triple, plus only the staging copies."""
    from mpi4py import MPI
    cuda_aware(cupy, monkeypatch, aware)
    sub = comm.Split(comm.rank // 8, comm.rank)
    if is_stand_in(cupy):
        monkeypatch.setenv("FAKE_CUPY_DEVICES", "8")
        monkeypatch.delenv("HPCPAR_SHARE_GPU")
    layout = dict(tp=2, pp=2, dp=2, microbatches=2, zero1=True)
    t = trainer(sub, backend="cupy", **layout)
    if is_stand_in(cupy):
        assert cupy.cuda.record.current_device == sub.rank      # one device per node-local rank
    got = [t.step(s).loss for s in range(2)]
    counter = CopyCounter(cupy, monkeypatch)
    t.step(2)
    staged = t.grid.world_comm.staging_bytes + t.grid.tp_comm.staging_bytes + t.grid.pp_comm.staging_bytes
    free(t)
    sub.Free()
    ref = trainer(MPI.COMM_SELF, backend="numpy")
    want = [ref.step(s).loss for s in range(2)]
    assert rel_err(got, want) <= 1e-10          # float64, other summation orders: not bit for bit
    assert counter.count == 1
    assert (counter.staged > 0) == (staged > 0) == (aware == "0")
