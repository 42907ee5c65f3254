"""Backend selection, dtype policy, CUDA-aware override (comm/device.py) and the scatter-add used by embeddings."""
import importlib.util

import numpy as np
import pytest

from hpcpar import backend
from hpcpar.comm.device import cuda_aware_mpi
from hpcpar.runtime import UsageError


def test_numpy_is_the_default():
    assert backend.xp() is np
    assert backend.name() == "numpy"


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="cupy is installed here")
def test_missing_cupy_is_a_clear_error():
    with pytest.raises(UsageError, match="cupy cannot be imported"):
        backend.use("cupy")
    backend.use("numpy")


def test_unknown_backend_and_dtype():
    with pytest.raises(UsageError, match="unknown backend"):
        backend.use("jax")
    with pytest.raises(UsageError, match="unknown dtype"):
        backend.resolve_dtype("float16x")
    assert backend.resolve_dtype("float64") == np.float64


def test_cuda_aware_override(monkeypatch):
    monkeypatch.setenv("HPCPAR_CUDA_AWARE", "1")
    assert cuda_aware_mpi() is True
    monkeypatch.setenv("HPCPAR_CUDA_AWARE", "0")
    assert cuda_aware_mpi() is False
    monkeypatch.setenv("HPCPAR_CUDA_AWARE", "yes")
    with pytest.raises(UsageError, match="must be 0 or 1"):
        cuda_aware_mpi()


def test_scatter_add_matches_add_at():
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 7, size=50)
    vals = rng.standard_normal((50, 3))
    want = np.zeros((7, 3))
    np.add.at(want, idx, vals)
    got = backend.scatter_add(np.zeros((7, 3)), idx, vals)
    np.testing.assert_allclose(got, want, rtol=1e-14)
