"""The single-rank training loop: determinism, learning, metrics."""
import json

from mpi4py import MPI

from mpitools import hpcpar, run
from train_helpers import trainer


def test_same_seed_same_losses_bit_for_bit():
    a = [trainer(MPI.COMM_SELF, dtype="float32").step(s).loss for s in range(3)]
    b = [trainer(MPI.COMM_SELF, dtype="float32").step(s).loss for s in range(3)]
    assert a == b           # bit for bit: the same computation twice on the same machine


def test_loss_goes_down():
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    t = Trainer(TrainConfig(steps=60, progress=False), MPI.COMM_SELF)       # the tiny preset's defaults
    losses = [t.step(s).loss for s in range(60)]
    assert sum(losses[-5:]) / 5 < 0.92 * losses[0]                         # 3.49 -> about 3.1 nats


def test_metrics_file_has_one_object_per_step(tmp_path):
    metrics = tmp_path / "runs" / "m.jsonl"                 # the folder is created
    proc, _ = run(hpcpar() + ["train", "--steps", "4", "--no-progress", "--metrics", str(metrics)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s"} <= set(rows[0])
    assert "entropy floor" in proc.stdout


def test_help_documents_every_flag():
    from dataclasses import fields
    from hpcpar.training.config import TrainConfig
    proc, _ = run(hpcpar() + ["train", "--help"])
    for f in fields(TrainConfig):
        flag = ("--no-" if f.default is True else "--") + f.name.replace("_", "-")
        assert flag in proc.stdout, flag
