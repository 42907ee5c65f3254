"""Tensor, pipeline and data parallelism on cupy arrays: same float64 losses as numpy; device buffers
through hpcpar.comm, staged or CUDA-aware.  Ranks share the GPU (HPCPAR_SHARE_GPU=1)."""
import numpy as np
import pytest

from gpu_helpers import require_gpu
from hpcpar import backend
from hpcpar.comm import Communicator
from train_helpers import free, rel_err, trainer

pytestmark = pytest.mark.gpu


@pytest.fixture
def cupy(monkeypatch):
    cp = require_gpu()
    monkeypatch.setenv("HPCPAR_SHARE_GPU", "1")
    yield cp
    backend.use("numpy")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("aware", ["0", "1"])
def test_collectives_on_device_buffers(comm, cupy, monkeypatch, aware):
    from mpi4py import MPI
    if aware == "1" and not getattr(MPI, "Query_cuda_support", lambda: False)():
        pytest.skip("this MPI is not CUDA-aware")
    monkeypatch.setenv("HPCPAR_CUDA_AWARE", aware)
    c = Communicator(comm, "gpu")
    x = cupy.arange(10, dtype=cupy.float64) + comm.rank
    want = np.arange(10) * comm.size + sum(range(comm.size))
    np.testing.assert_allclose(cupy.asnumpy(c.all_reduce(x)), want)
    np.testing.assert_allclose(cupy.asnumpy(c.all_gather(x)), np.concatenate([np.arange(10) + r
                                                                             for r in range(comm.size)]))
    assert (c.staging_bytes > 0) == (aware == "0")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("layout", [dict(tp=2), dict(pp=2, microbatches=2), dict(dp=2),
                                    dict(tp=2, sequence_parallel=True)], ids=["tp2", "pp2", "dp2", "tp2sp"])
def test_layouts_on_cupy_match_numpy(comm, cupy, layout):
    sub = comm.Split(comm.rank // 2, comm.rank)
    runs = {}
    for name in ("numpy", "cupy"):
        t = trainer(sub, backend=name, **layout)
        runs[name] = [t.step(s).loss for s in range(2)]
        free(t)
    sub.Free()
    assert rel_err(runs["cupy"], runs["numpy"]) <= 1e-10
