"""Mixed precision on one rank: fp32 masters, loss scaling that reacts to overflow, fp16 and bf16
training curves that track fp32, and the refusals."""
import json

import numpy as np
import pytest

from hpcpar.precision import LossScaler
from mpitools import hpcpar, run

# A smaller model than `tiny` so that 200 steps in each precision stay cheap (~2 s each here; bf16's
# elementwise arithmetic through ml_dtypes is slow, GEMMs are emulated in fp32).
DIMS = dict(model="tiny", layers=2, hidden=32, heads=4, seq_len=16, batch_size=8, synthetic_vocab=16,
            warmup=10, progress=False, seed=3)


def run_trainer(precision, steps, **kw):
    from mpi4py import MPI
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    t = Trainer(TrainConfig(precision=precision, steps=steps, **dict(DIMS, **kw)), MPI.COMM_SELF)
    return t, [t.step(s).loss for s in range(steps)]


def test_the_scaler_halves_on_overflow_and_grows_after_good_steps():
    s = LossScaler(dynamic=True, growth_interval=3)
    assert s.scale == 2.0 ** 16
    s.update(grads_finite=False)
    assert s.scale == 2.0 ** 15
    for _ in range(3):
        s.update(grads_finite=True)
    assert s.scale == 2.0 ** 16
    assert LossScaler(dynamic=False).scale == 1.0


def test_masters_and_optimizer_state_stay_fp32():
    t, _ = run_trainer("fp16", 1)
    for p in t.parameters():
        assert p.data.dtype == np.float16 and p.master.dtype == np.float32 and p.grad.dtype == np.float32
        np.testing.assert_array_equal(p.data, p.master.astype(np.float16))    # the copy is the rounded master
    assert all(v.dtype == np.float32 for st in t.optimizer.state.values() for v in st.values())


def test_a_forced_overflow_skips_the_step_and_halves_the_scale():
    t, _ = run_trainer("fp16", 2)
    before = [p.master.copy() for p in t.parameters()]
    t.scaler.scale = 2.0 ** 40                       # scaled gradients beyond fp16's 65504: inf
    r = t.step(2)
    assert r.skipped and np.isfinite(r.loss) and not np.isfinite(r.grad_norm)
    assert t.scaler.scale == 2.0 ** 39
    for p, b in zip(t.parameters(), before):
        np.testing.assert_array_equal(p.master, b)  # the step was skipped: weights untouched
    skipped = [t.step(s).skipped for s in range(3, 30)]    # it halves again until the gradients fit
    assert skipped[0] and False in skipped and t.scaler.scale <= 2.0 ** (39 - skipped.count(True))


@pytest.fixture(scope="module")
def fp32_curve():
    return run_trainer("fp32", 200)[1]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_200_low_precision_steps_track_fp32(precision, fp32_curve):
    """Rounding makes two trajectories drift apart step by step, so the curves are compared as 20-step
    means: measured within 0.016 (fp16) and 0.021 (bf16) of fp32's, losses about 2.2 to 2.8; bound
    0.05.  And the run learns as much as fp32 does."""
    ref = fp32_curve
    _, got = run_trainer(precision, 200)
    window = np.ones(20) / 20
    smooth_ref, smooth = np.convolve(ref, window, "valid"), np.convolve(got, window, "valid")
    assert np.abs(smooth - smooth_ref).max() <= 0.05
    assert smooth[-1] < smooth[0] - 0.2


def test_fp16_from_the_command_line_logs_the_loss_scale(tmp_path):
    metrics = tmp_path / "m.jsonl"
    proc, _ = run(hpcpar() + ["train", "--precision", "fp16", "--steps", "3", "--layers", "1", "--hidden", "16",
                              "--seq-len", "8", "--batch-size", "4", "--no-progress", "--metrics", str(metrics)])
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["loss_scale"] for r in records] == [2.0 ** 16] * 3


@pytest.mark.parametrize("args, message", [
    (["--precision", "fp16", "--dtype", "float64"], "keeps float32 master weights"),
    (["--tf32"], "--tf32 applies to float32 GEMMs on a GPU only"),
])
def test_refused_in_one_line(args, message):
    proc, _ = run(hpcpar() + ["train", "--steps", "1"] + args)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_fp16_resumes_with_its_loss_scale(tmp_path):
    from hpcpar.checkpoint import load_checkpoint, save_checkpoint
    t, _ = run_trainer("fp16", 2)
    t.scaler.scale, t.scaler.good_steps = 2.0 ** 12, 5
    save_checkpoint(t, tmp_path / "ck", 2)
    want = [t.step(s).loss for s in (2, 3)]
    resumed, _ = run_trainer("fp16", 0)
    assert load_checkpoint(resumed, tmp_path / "ck") == 2
    assert (resumed.scaler.scale, resumed.scaler.good_steps) == (2.0 ** 12, 5)
    # the same computation on the same machine from the same fp32 masters: equal to round-off
    np.testing.assert_allclose([resumed.step(s).loss for s in (2, 3)], want, rtol=1e-12)
