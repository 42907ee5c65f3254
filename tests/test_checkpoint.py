"""Checkpoint files on one rank: atomicity, conversion round trips, and every kind of damage named."""
import json
import os

import numpy as np
import pytest

from hpcpar.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from hpcpar.checkpoint.consolidated import export, init_from, read_weights
from hpcpar.checkpoint.convert import convert, inspect
from hpcpar.checkpoint.files import CheckpointError
from hpcpar.runtime import AgreedError, UsageError
from mpitools import hpcpar, run
from train_helpers import trainer


@pytest.fixture
def solo():
    from mpi4py import MPI
    return MPI.COMM_SELF


def saved(solo, tmp_path, steps=2, **kw):
    t = trainer(solo, **kw)
    for s in range(steps):
        t.step(s)
    save_checkpoint(t, tmp_path / "ck", steps)
    return t


def test_layout_on_disk_and_keep(solo, tmp_path):
    t = trainer(solo)
    for s in range(5):
        t.step(s)
        save_checkpoint(t, tmp_path / "ck", s + 1, keep=2)
    names = sorted(os.listdir(tmp_path / "ck"))
    assert names == ["latest", "step-00000004", "step-00000005"]
    assert (tmp_path / "ck" / "latest").read_text() == "step-00000005\n"
    manifest = json.loads((tmp_path / "ck" / "step-00000005" / "manifest.json").read_text())
    assert manifest["step"] == 5 and manifest["optimizer"]["t"] == 5
    assert set(manifest["optimizer"]["states"]) == {"exp_avg", "exp_avg_sq"}
    assert all(len(f["sha256"]) == 64 for f in manifest["files"].values())


def test_export_then_import_is_exact(solo, tmp_path):
    t = saved(solo, tmp_path)
    export(t, tmp_path / "model.safetensors")
    fresh = trainer(solo)
    init_from(fresh, tmp_path / "model.safetensors")
    for p, q in zip(t.parameters(), fresh.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    names = set(read_weights(tmp_path / "model.safetensors"))
    assert {"wte.weight", "wpe.weight", "h.0.attn.c_attn.weight", "ln_f.weight"} <= names


def test_hugging_face_names_are_understood(solo, tmp_path):
    """A GPT2LMHeadModel file: 'transformer.' prefix, attention-mask buffers, a duplicated tied head."""
    from safetensors.numpy import save_file
    t = trainer(solo)
    hf = {f"transformer.{p.name}": p.data.copy() for p in t.parameters()}
    hf["transformer.h.0.attn.bias"] = np.ones((1, 1, 8, 8))
    hf["lm_head.weight"] = hf["transformer.wte.weight"].copy()
    save_file(hf, str(tmp_path / "hf.safetensors"))
    fresh = trainer(solo, seed=99)
    init_from(fresh, tmp_path / "hf.safetensors")
    for p, q in zip(t.parameters(), fresh.parameters()):
        np.testing.assert_array_equal(p.data, q.data)


def test_convert_round_trips(solo, tmp_path):
    t = saved(solo, tmp_path)
    convert(tmp_path / "ck", tmp_path / "w.safetensors")
    convert(tmp_path / "ck", tmp_path / "one")
    back = trainer(solo)
    assert load_checkpoint(back, tmp_path / "one") == 2
    for p, q in zip(t.parameters(), back.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    assert back.optimizer.t == 2 and back.optimizer.state
    convert(tmp_path / "w.safetensors", tmp_path / "fromw")
    assert load_checkpoint(trainer(solo), tmp_path / "fromw") == 0
    report = inspect(tmp_path / "ck")
    assert "step 2" in report and "checksums verified" in report


def damage(step_dir, how):
    f = step_dir / "rank-00000.safetensors"
    if how == "missing":
        f.unlink()
    elif how == "truncated":
        f.write_bytes(f.read_bytes()[:-100])
    elif how == "corrupt":
        data = bytearray(f.read_bytes())
        data[-10] ^= 0xFF
        f.write_bytes(bytes(data))
    elif how == "manifest":
        (step_dir / "manifest.json").write_text("{not json")


@pytest.mark.parametrize("how, message", [("missing", "rank-00000.safetensors is missing"),
                                          ("truncated", "truncated or altered"),
                                          ("corrupt", "checksum mismatch"),
                                          ("manifest", "manifest.json is unreadable")])
def test_damaged_checkpoint_is_named(solo, tmp_path, how, message):
    saved(solo, tmp_path)
    damage(latest_checkpoint(tmp_path / "ck"), how)
    with pytest.raises(AgreedError, match=message):
        load_checkpoint(trainer(solo), tmp_path / "ck")


def test_other_model_is_refused(solo, tmp_path):
    saved(solo, tmp_path)
    with pytest.raises(UsageError, match="holds another model: hidden = 32 there, 64 in this run"):
        load_checkpoint(trainer(solo, hidden=64), tmp_path / "ck")


def test_no_checkpoint_yet_means_start_fresh(solo, tmp_path):
    assert load_checkpoint(trainer(solo), tmp_path / "empty") is None


def test_full_disk_leaves_the_previous_checkpoint(solo, tmp_path, monkeypatch):
    t = saved(solo, tmp_path)
    before = (tmp_path / "ck" / "latest").read_text()
    t.step(2)
    monkeypatch.setenv("HPCPAR_FAULT", "write@0")
    with pytest.raises(AgreedError, match="No space left on device"):
        save_checkpoint(t, tmp_path / "ck", 3)
    assert (tmp_path / "ck" / "latest").read_text() == before
    assert load_checkpoint(trainer(solo), tmp_path / "ck") == 2


def test_inspect_and_convert_commands(solo, tmp_path):
    saved(solo, tmp_path)
    proc, _ = run(hpcpar() + ["checkpoint", "inspect", str(tmp_path / "ck")])
    assert proc.returncode == 0 and "all checksums verified" in proc.stdout
    proc, _ = run(hpcpar() + ["checkpoint", "inspect", str(tmp_path / "nothing")])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not a checkpoint" in proc.stderr


def test_convert_refuses_nonsense(tmp_path):
    with pytest.raises(CheckpointError):
        convert(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
