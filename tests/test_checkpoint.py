"""Checkpoint files on one rank: atomicity, conversion round trips, and every kind of damage named."""
import json
import os
import shutil

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


def test_rotation_counts_steps_by_number_among_the_runs_own(solo, tmp_path):
    """--keep deletes only the saving run's steps, oldest by number (9 digits sort after 8), never the step
    just written - even when a higher one of the run is there."""
    t, ck = trainer(solo), tmp_path / "ck"
    for step in (7, 8, 9):
        save_checkpoint(t, ck, step, keep=3, run="other")
    for step in (99_999_999, 100_000_000, 1):
        save_checkpoint(t, ck, step, keep=1, run="mine")
    names = sorted(p.name for p in ck.glob("step-*"))
    assert names == ["step-00000001", "step-00000007", "step-00000008", "step-00000009", "step-100000000"]
    assert (ck / "latest").read_text() == "step-00000001\n"
    save_checkpoint(t, ck, 2, keep=0, run="mine")                 # keep 0: the stop paths delete nothing
    assert (ck / "step-00000001").is_dir() and (ck / "step-100000000").is_dir()


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_a_step_written_again_is_swapped_in_whole(solo, tmp_path, monkeypatch, exchange):
    t = saved(solo, tmp_path)
    if not exchange:                                   # a file system without renameat2's exchange
        monkeypatch.setattr("hpcpar.checkpoint.directory.exchange", lambda a, b: False)
    t.step(2)
    save_checkpoint(t, tmp_path / "ck", 2)
    assert sorted(os.listdir(tmp_path / "ck")) == ["latest", "step-00000002"]
    back = trainer(solo)
    assert load_checkpoint(back, tmp_path / "ck") == 2
    for p, q in zip(t.parameters(), back.parameters()):
        np.testing.assert_array_equal(p.data, q.data)          # the new copy, not the old


@pytest.mark.parametrize("left", ["new copy complete", "new copy half written"])
def test_a_publish_killed_between_its_renames_is_recovered(solo, tmp_path, left):
    """SIGKILL between moving step-N aside and moving its new copy in: latest names a missing step.  The
    reader takes the complete new copy (else the old one); the next save puts it in place."""
    t = saved(solo, tmp_path)
    ck = tmp_path / "ck"
    (ck / "step-00000002").rename(ck / "step-00000002.old")
    shutil.copytree(ck / "step-00000002.old", ck / "step-00000002.partial")
    if left == "new copy half written":
        (ck / "step-00000002.partial" / "manifest.json").unlink()
    want = "step-00000002.partial" if left == "new copy complete" else "step-00000002.old"
    assert latest_checkpoint(ck).name == want
    assert load_checkpoint(trainer(solo), ck) == 2
    t.step(2)
    save_checkpoint(t, ck, 3)
    assert sorted(os.listdir(ck)) == ["latest", "step-00000002", "step-00000003"]
    assert load_checkpoint(trainer(solo), ck) == 3


def test_a_manifest_whose_step_disagrees_with_its_folder_is_refused(solo, tmp_path):
    saved(solo, tmp_path)
    path = tmp_path / "ck" / "step-00000002" / "manifest.json"
    path.write_text(path.read_text().replace('"step": 2,', '"step": 1000,'))
    with pytest.raises(AgreedError, match="manifest.json says step 1000 but its folder is step 2"):
        load_checkpoint(trainer(solo), tmp_path / "ck")


def test_a_checkpoint_holding_nan_is_refused(solo, tmp_path):
    """A poisoned file whose checksums were forged to match: the numbers themselves are checked."""
    from hpcpar.checkpoint.files import sha256
    from safetensors.numpy import load_file, save_file
    saved(solo, tmp_path)
    step = tmp_path / "ck" / "step-00000002"
    tensors = load_file(str(step / "rank-00000.safetensors"))
    tensors["wte.weight"][0, 0] = np.nan
    save_file(tensors, str(step / "rank-00000.safetensors"), metadata={"format": "hpcpar-checkpoint/1", "step": "2"})
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["files"]["rank-00000.safetensors"] = {"sha256": sha256(step / "rank-00000.safetensors"),
                                                   "bytes": (step / "rank-00000.safetensors").stat().st_size}
    (step / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(AgreedError, match="wte.weight holds NaN or inf"):
        load_checkpoint(trainer(solo), tmp_path / "ck")


def test_convert_writes_through_partial_and_never_over_a_checkpoint(solo, tmp_path, monkeypatch):
    saved(solo, tmp_path)
    ck, out = tmp_path / "ck", tmp_path / "one"
    before = {p: p.read_bytes() for p in ck.rglob("*") if p.is_file()}
    for dst in (ck, ck / "step-00000002"):
        with pytest.raises(CheckpointError, match="holds a checkpoint already"):
            convert(ck, dst)
    assert {p: p.read_bytes() for p in ck.rglob("*") if p.is_file()} == before
    monkeypatch.setenv("HPCPAR_FAULT", "write@0")         # the disk fills up mid-conversion
    with pytest.raises(CheckpointError, match="No space left on device"):
        convert(ck, out)
    assert not (out / "latest").exists() and not (out / "step-00000002").exists()
    monkeypatch.delenv("HPCPAR_FAULT")
    convert(ck, out)                                        # the half-written copy is no obstacle
    assert load_checkpoint(trainer(solo), out) == 2


def test_the_lock_refuses_a_live_run_and_takes_over_a_gone_ones(tmp_path, monkeypatch):
    """checkpoint/lock.py alone: the holder named; a stale lock (its pid gone from this host, or this
    Slurm job's) taken over; two takers of one stale lock never both hold it."""
    import socket
    import subprocess
    from hpcpar.checkpoint import lock
    live = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = socket.gethostname()
    path = tmp_path / "lock"
    try:
        path.write_text(json.dumps({"host": host, "pid": live.pid, "job": "77", "since": "then"}))
        with pytest.raises(UsageError, match=f"is in use by another run \\(pid {live.pid} on {host}, Slurm job 77"):
            lock.acquire(tmp_path)
        path.write_text(json.dumps({"host": "elsewhere", "pid": live.pid, "job": "77", "since": "then"}))
        monkeypatch.setenv("SLURM_JOB_ID", "77")               # this job's earlier attempt: over
        assert lock.acquire(tmp_path) == path and json.loads(path.read_text())["pid"] == os.getpid()
        monkeypatch.delenv("SLURM_JOB_ID")
        stale = {"host": host, "pid": gone.pid, "job": None, "since": "then"}
        fresh = {"host": host, "pid": live.pid, "job": None, "since": "now"}
        path.write_text(json.dumps(stale))
        path.rename(tmp_path / "held")                  # the other taker moved it first and took the lock:
        path.write_text(json.dumps(fresh))
        lock._take_over(path, stale, lock._me())         # this one's rename finds a fresh lock and puts it back
        assert json.loads(path.read_text()) == fresh
        lock.release(path)                               # not ours: left alone
        assert path.exists()
    finally:
        live.kill()
        live.wait()
