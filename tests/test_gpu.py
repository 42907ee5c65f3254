"""The engine on cupy arrays against numpy, float64 (skipped without cupy and a GPU: make test-gpu)."""
import numpy as np
import pytest

from gpu_helpers import CopyCounter, require_gpu
from hpcpar import backend
from hpcpar.nn import GPT, GPTConfig

pytestmark = pytest.mark.gpu


@pytest.fixture
def cupy():
    cp = require_gpu()
    yield cp
    backend.use("numpy")


def grads(model, ids, targets):
    loss, caches = model.forward(ids, None, targets)
    model.backward(1.0 / targets.size, caches)
    return backend.to_numpy(loss), {p.name: backend.to_numpy(p.grad) for p in model.parameters()}


@pytest.mark.parametrize("tied", [True, False])
def test_gpt_on_cupy_matches_numpy(cupy, tied):
    cfg = GPTConfig(vocab_size=37, seq_len=16, n_layer=2, n_head=4, d_model=32, tied=tied, dropout=0.1)
    tokens = np.random.default_rng(0).integers(0, 37, size=(4, 17))
    backend.use("numpy")
    want_loss, want = grads(GPT(cfg, seed=1, dtype="float64"), tokens[:, :-1], tokens[:, 1:])
    backend.use("cupy")
    got_loss, got = grads(GPT(cfg, seed=1, dtype="float64"), cupy.asarray(tokens[:, :-1]),
                          cupy.asarray(tokens[:, 1:]))
    assert abs(got_loss - want_loss) <= 1e-10 * abs(want_loss)
    for name, g in want.items():
        assert np.linalg.norm(got[name] - g) <= 1e-10 * np.linalg.norm(g), name


def test_a_step_copies_to_the_host_once(cupy, monkeypatch):
    """Inside a training step the only device-to-host copy is the agreed (loss, norm, stop) triple."""
    from mpi4py import MPI
    from train_helpers import trainer
    t = trainer(MPI.COMM_SELF, backend="cupy", dtype="float32")
    t.step(0)                                   # warm-up: allocations, kernel compilation
    counter = CopyCounter(cupy, monkeypatch)
    t.step(1)
    assert counter.count == 1
