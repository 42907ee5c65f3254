"""The GEMM provider (hpcpar/blas): each installed library against numpy in every layout the engine
hands it, the run's choice (flag, environment, auto) and its refusals, and a bf16 run on a library
agreeing with numpy's emulated bf16 - op by op and over a few training steps.

A library that is not installed skips its cases (CI runs this file with MKL installed and without)."""
import numpy as np
import pytest
from mpi4py import MPI

from hpcpar import blas, precision
from hpcpar.runtime import UsageError
from mpitools import hpcpar, run
from train_helpers import trainer

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
LIBRARIES = sorted(blas.LOADERS)


def library(name):
    try:
        return blas.load(name)
    except UsageError:
        pytest.skip(f"{name} is not installed (make install GEMM={name})")


@pytest.fixture
def provider_back():
    saved = blas.provider(), blas._state["why"]
    yield
    blas.use(*saved)


def layouts(dtype):
    """(a, b, out) in the layouts the engine multiplies: plain, transposed views, column slices,
    strided copies, batched (attention's blocks), a strided out, size-one edges, a broadcast batch."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 7, 9)).astype(dtype)
    k = rng.standard_normal((3, 4, 7, 9)).astype(dtype)
    w = rng.standard_normal((9, 11)).astype(dtype)
    o = np.empty((3, 7, 4, 7), np.float32).transpose(0, 2, 1, 3)     # attention's o: a (B, T, NH, HS) view
    return [(x[0, 0], w, None), (x[0, 0], w[:, 2:8], None), (x[0, 0], w.T.copy().T, None),
            (x[0, 0].T, x[0, 1], None), (x, k.transpose(0, 1, 3, 2), None),
            (x[:, :, 2:5], k[:, :, :6].transpose(0, 1, 3, 2), None), (x, k.transpose(0, 1, 3, 2), o),
            (x[:, :, ::2], w, None), (x[..., ::2], w[::2], None), (x[:, :, :1], w, None), (x[0, 0], w[:, :1], None),
            (x[:, None, 0], k[None, :, 0].transpose(0, 1, 3, 2), None), (x[0, 0, :, :0], w[:0], None)]


@pytest.mark.parametrize("name", LIBRARIES)
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16], ids=["fp32", "bf16", "fp16"])
def test_each_library_multiplies_every_layout_like_numpy(name, dtype):
    """fp16: oneMKL's own kernel, oneDNN's fp32 one on widened inputs."""
    p = library(name)
    for a, b, out in layouts(dtype):
        want = np.matmul(a.astype(np.float64), b.astype(np.float64))
        got = p.matmul(a, b, out)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5), (a.shape, a.strides, b.shape, b.strides)
        if out is not None:
            assert got is out
        acc = np.ones(want.shape, np.float32)
        p.matmul(a, b, acc, add=True)                     # C = A B + C, also through a temporary for o
        assert np.allclose(acc, want + 1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", LIBRARIES)
def test_bf16_gemm_on_a_library_agrees_with_the_emulation(name, provider_back):
    """Op by op: the fp32 sums agree to fp32 round-off; rounded to bf16, by at most one bf16 step."""
    library(name)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((64, 96)).astype(BF16), rng.standard_normal((96, 48)).astype(BF16)
    got = {}
    for p in ("numpy", name):
        blas.use(blas.load(p))
        got[p] = precision.gemm(a, b, dtype=np.float32), precision.gemm(a, b)
    (emul32, emul16), (lib32, lib16) = got["numpy"], got[name]
    assert np.abs(lib32 - emul32).max() <= 1e-6 * np.abs(emul32).max()
    assert lib16.dtype == BF16
    one_step = 2.0 ** -7 * np.abs(emul32)              # a bf16 step (8 significant bits) at that size, at most
    assert np.all(np.abs(lib16.astype(np.float32) - emul16.astype(np.float32)) <= one_step)


def test_float64_stays_numpys_whatever_the_provider(provider_back):
    a = np.random.default_rng(0).standard_normal((33, 17))
    for p in blas.installed():
        blas.use(p)
        assert np.array_equal(precision.gemm(a, a.T), np.matmul(a, a.T))


@pytest.mark.parametrize("name", LIBRARIES)
def test_a_bf16_run_on_a_library_follows_the_emulated_one(name, provider_back):
    """Three AdamW steps of a small GPT in bf16: the losses of the library's run and of numpy's
    emulation agree within 1e-4 relative (measured 3e-6 to 5e-6: fp32 round-off, now and then
    flipping a bf16 rounding; bf16's own step is 8e-3)."""
    library(name)
    losses = {}
    for p in ("numpy", name):
        t = trainer(MPI.COMM_SELF, dtype="float32", precision="bf16", gemm=p, hidden=64, layers=2, heads=4,
                    seq_len=16)
        losses[p] = [t.step(k).loss for k in range(3)]
    assert np.allclose(losses[name], losses["numpy"], rtol=1e-4, atol=0)


def test_the_choice(monkeypatch):
    monkeypatch.delenv(blas.ENV, raising=False)
    assert blas.choose("numpy", BF16)[0] is blas.NUMPY
    assert blas.choose("", np.float32) == (blas.NUMPY, "auto: float32 runs keep numpy's BLAS")
    monkeypatch.setenv(blas.ENV, "numpy")
    assert blas.choose("", BF16) == (blas.NUMPY, f"asked for (--gemm or ${blas.ENV})")
    monkeypatch.delenv(blas.ENV)
    monkeypatch.setattr(blas, "cpu_flags", lambda names=(): [])
    p, why = blas.choose("", BF16)
    assert p is blas.NUMPY and why == "auto: bfloat16 emulated in fp32, this CPU has no bfloat16 unit"
    monkeypatch.setattr(blas, "cpu_flags", lambda names=(): ["avx512_bf16"])
    monkeypatch.setattr(blas, "installed", lambda: [blas.NUMPY])
    assert blas.choose("", BF16)[1] == "auto: bfloat16 emulated in fp32, no library with a kernel for it installed"


def test_auto_takes_a_library_only_when_the_probe_says_it_pays(monkeypatch):
    lib = blas.Provider("fast", blas.libraries.Library("fast", "v1", {BF16: None}, lambda n: None))
    monkeypatch.setattr(blas, "cpu_flags", lambda names=(): ["avx512_bf16"])
    monkeypatch.setattr(blas, "installed", lambda: [blas.NUMPY, lib])
    for seconds, chosen in ((1.0, blas.NUMPY), (0.5, lib)):
        monkeypatch.setattr(blas, "probe", lambda providers, dtype: {"numpy": 1.1, "fast": seconds})
        monkeypatch.setattr(blas, "_probed", {})             # the probe runs once per process
        assert blas.choose("auto", BF16)[0] is chosen


def test_a_library_not_installed_is_refused(monkeypatch):
    monkeypatch.setitem(blas.libraries.LOADERS, "mkl", lambda threads: None)
    monkeypatch.delitem(blas._loaded, "mkl", raising=False)
    with pytest.raises(UsageError, match=r"--gemm mkl: its library is not installed \(make install GEMM=mkl"):
        blas.load("mkl")
    with pytest.raises(UsageError, match="--gemm must be one of auto, numpy, mkl, onednn, not 'blis'"):
        blas.load("blis")


def test_the_command_line_refuses_an_unknown_library_and_names_the_one_it_used(tmp_path):
    proc, _ = run(hpcpar() + ["train", "--model", "tiny", "--steps", "1", "--gemm", "blis"], timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "hpcpar: error: --gemm must be one of auto, numpy, mkl, onednn, not 'blis'"]
    proc, _ = run(hpcpar() + ["train", "--model", "tiny", "--steps", "1", "--no-progress", "--gemm", "numpy",
                              "--layers", "1", "--hidden", "16", "--heads", "2"], timeout=120)
    line = next(s.strip() for s in proc.stdout.splitlines() if s.strip().startswith("gemm"))
    assert line == f"gemm        numpy (numpy's BLAS): asked for (--gemm or ${blas.ENV})"
