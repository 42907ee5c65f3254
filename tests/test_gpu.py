"""The engine on the device against numpy, one rank: on a GPU with cupy, and otherwise on the strict
CuPy stand-in (tests/fake_cupy), so that these run in every ``make test``."""
import numpy as np
import pytest

from gpu_helpers import CopyCounter, device_module, is_stand_in
from hpcpar import backend
from hpcpar.nn import GPT, GPTConfig, MLPConfig, MLPModel

pytestmark = pytest.mark.gpu


@pytest.fixture
def cupy(monkeypatch):
    cp = device_module(monkeypatch)
    yield cp
    backend.use("numpy")


def grads(model, x, targets):
    loss, caches = model.forward(x, None, targets)
    model.backward(1.0 / targets.size, caches)
    return backend.to_numpy(loss), {p.name: backend.to_numpy(p.grad) for p in model.parameters()}


def same_run(build, cupy, x, targets):
    """float64 loss and gradients of the model built by ``build`` on numpy and on the device. The device
    may order its reductions differently (cuBLAS): agreement to 1e-10 relative, not bit for bit."""
    backend.use("numpy")
    want_loss, want = grads(build(), x, targets)
    backend.use("cupy")
    got_loss, got = grads(build(), cupy.asarray(x), cupy.asarray(targets))
    assert abs(got_loss - want_loss) <= 1e-10 * abs(want_loss)
    for name, g in want.items():
        assert np.linalg.norm(got[name] - g) <= 1e-10 * np.linalg.norm(g), name


@pytest.mark.parametrize("tied", [True, False])
def test_gpt_on_the_device_matches_numpy(cupy, tied):
    cfg = GPTConfig(vocab_size=37, seq_len=16, n_layer=2, n_head=4, d_model=32, tied=tied, dropout=0.1)
    tokens = np.random.default_rng(0).integers(0, 37, size=(4, 17))
    same_run(lambda: GPT(cfg, seed=1, dtype="float64"), cupy, tokens[:, :-1], tokens[:, 1:])


def test_deepseek_with_mtp_on_the_device_matches_numpy(cupy):
    """MLA (YaRN, values wider than the heads), grouped routing and an MTP module on the device: numpy's loss
    and gradients."""
    from dataclasses import replace

    from hpcpar.nn.mtp import mtp_targets
    from test_mla import WIDE_V
    cfg = replace(WIDE_V, mtp_depth=1)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(3, cfg.seq_len + 1))
    same_run(lambda: GPT(cfg, seed=1, dtype="float64"), cupy, tokens[:, :-1], mtp_targets(tokens[:, 1:], 1))


def test_mlp_on_the_device_matches_numpy(cupy):
    cfg = MLPConfig(d_in=8, d_model=16, d_ff=32, n_layer=3, d_out=4)
    rng = np.random.default_rng(1)
    same_run(lambda: MLPModel(cfg, seed=1, dtype="float64"), cupy, rng.standard_normal((6, 8)),
             rng.standard_normal((6, 4)))


def test_a_step_copies_to_the_host_once(cupy, monkeypatch):
    """Inside a training step the only device-to-host copy is the agreed (loss, norm, stop) triple.
    A float() or .item() of a loss, an np.asarray of a gradient, ... anywhere in the step breaks this."""
    from mpi4py import MPI
    from train_helpers import trainer
    t = trainer(MPI.COMM_SELF, backend="cupy", dtype="float32", dropout=0.1)
    t.step(0)                                   # warm-up: allocations, kernel compilation
    counter = CopyCounter(cupy, monkeypatch)
    t.step(1)
    assert (counter.count, counter.staged) == (1, 0)


def test_a_deepseek_step_with_mtp_copies_to_the_host_once(cupy, monkeypatch):
    """MLA, and the MTP modules' loss sum on the device until the step's one all-reduce carries it (every
    layer dense here: a mixture of experts copies its routing counts to the host, three a layer)."""
    from mpi4py import MPI
    from train_helpers import trainer
    t = trainer(MPI.COMM_SELF, backend="cupy", dtype="float32", dims=dict(
        model="deepseek-tiny", layers=2, hidden=32, heads=4, ffn=16, seq_len=8, synthetic_vocab=29, batch_size=8,
        mtp=1, dims="first_dense=3"))
    t.step(0)
    counter = CopyCounter(cupy, monkeypatch)
    t.step(1)
    assert (counter.count, counter.staged) == (1, 0) and t.mtp_loss > 0


def test_checkpoint_save_and_resume_from_device_arrays(cupy, tmp_path):
    """Save after 2 steps on the device, resume into a fresh device trainer: steps 3 and 4 repeat the
    uninterrupted run's (the same computation on the same machine: equal to round-off)."""
    from mpi4py import MPI
    from hpcpar.checkpoint import load_checkpoint, save_checkpoint
    from train_helpers import trainer
    t = trainer(MPI.COMM_SELF, backend="cupy")
    for s in range(2):
        t.step(s)
    save_checkpoint(t, tmp_path / "ck", 2)
    want = [t.step(s).loss for s in (2, 3)]
    resumed = trainer(MPI.COMM_SELF, backend="cupy")
    assert load_checkpoint(resumed, tmp_path / "ck") == 2
    assert all(backend.is_device_array(p.data) for p in resumed.parameters())
    np.testing.assert_allclose([resumed.step(s).loss for s in (2, 3)], want, rtol=1e-12)


def test_the_stand_in_refuses_implicit_host_arrays(cupy):
    """The rules the stand-in enforces, as CuPy does (on a real GPU: CuPy itself)."""
    d = cupy.arange(4.0)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(d)
    with pytest.raises(TypeError):
        d + np.ones(4)
    with pytest.raises(TypeError):
        np.ones(4) * d
    assert float(d.sum()) == 6.0 and cupy.asnumpy(d).tolist() == [0.0, 1.0, 2.0, 3.0]
    if is_stand_in(cupy):
        from fake_cupy.transfers import log
        assert log.to_host == {"float()": 1, "get": 1} and log.to_device == {}


def test_fp16_on_the_device_matches_numpy_fp16(cupy, monkeypatch):
    """Mixed precision on the device: the same losses as on the CPU in fp16 (the CPU emulates the
    tensor-core GEMM, the device runs its own: a few fp16 roundings apart), one host copy a step."""
    from mpi4py import MPI
    from train_helpers import trainer
    runs = {}
    for name in ("numpy", "cupy"):
        t = trainer(MPI.COMM_SELF, backend=name, dtype="float32", precision="fp16", layers=2)
        runs[name] = [t.step(s).loss for s in range(2)]
    counter = CopyCounter(cupy, monkeypatch)
    t.step(2)
    assert counter.count == 1
    assert all(p.data.dtype == cupy.float16 and p.master.dtype == cupy.float32 for p in t.parameters())
    np.testing.assert_allclose(runs["cupy"], runs["numpy"], rtol=2 * np.finfo(np.float16).eps)


def test_bf16_needs_a_cupy_that_has_it(cupy):
    from hpcpar.precision import bfloat16, compute_dtype
    from hpcpar.runtime import UsageError
    if bfloat16(cupy) is not None:
        assert compute_dtype("bf16", cupy, np.float32).name == "bfloat16"
        return
    with pytest.raises(UsageError, match="this cupy has no bfloat16"):
        compute_dtype("bf16", cupy, np.float32)


def test_tf32_sets_the_cublas_compute_type(cupy):
    from mpi4py import MPI
    from train_helpers import trainer
    t = trainer(MPI.COMM_SELF, backend="cupy", dtype="float32", tf32=True)
    assert np.isfinite(t.step(0).loss)
    if is_stand_in(cupy):
        from fake_cupy._core._routines_linalg import COMPUTE_TYPE_TF32
        assert cupy.cuda.record.compute_types == {"float32": COMPUTE_TYPE_TF32}
    else:                                   # leave the process as it was for the tests that follow
        from cupy._core import _routines_linalg as linalg
        linalg.set_compute_type(cupy.float32, linalg.COMPUTE_TYPE_DEFAULT)
