"""The failure model (docs/reliability.md), tested on whole jobs launched with mpiexec.

Every case must end quickly, non-zero, with a message that says what happened - never a hang.
"""
import os
import signal
import subprocess
import time

import pytest

from mpitools import hpcpar, mpiexec, run_mpi

FAST = ["--steps", "4", "--no-progress", "--layers", "4", "--batch-size", "8", "--seq-len", "16"]


def bad_config_file(tmp_path, text):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


# (flags, a piece of the one-line message). Run under mpiexec -n 4.
BAD_INPUT = [
    (["--tp", "3"], "does not divide the world size 4"),
    (["--tp", "2", "--pp", "2", "--dp", "2"], "2 x 2 x 2 = 8 does not match the world size 4"),
    (["--tp", "0"], "--tp must be at least 1"),
    (["--pp", "-1"], "--pp must be at least 1"),
    (["--dp", "-2"], "--dp must not be negative"),
    (["--schedule", "fancy"], "invalid choice: 'fancy'"),
    (["--microbatches", "3"], "must divide into dp x microbatches"),
    (["--schedule", "interleaved", "--chunks", "1"], "needs --chunks >= 2"),
    (["--chunks", "2"], "--chunks 2 needs --schedule interleaved"),
    (["--pp", "2", "--dp", "2", "--schedule", "interleaved", "--layers", "6"], "do not divide into pp x chunks"),
    (["--pp", "4", "--layers", "2"], "2 layers cannot fill"),
    (["--data", "/no/such/file.txt"], "data file /no/such/file.txt not found"),
    (["--config", "/no/such/run.toml"], "config file /no/such/run.toml not found"),
    (["--config", "{tmp}/bad.toml::steps = [1,"], "cannot read config file"),
    (["--config", "{tmp}/bad.toml::stepz = 3"], "unknown option 'stepz'"),
    (["--config", "{tmp}/bad.toml::steps = 'many'"], "option 'steps' must be int"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--lr", "-1"], "--lr must be positive"),
    (["--steps", "-5"], "--steps must not be negative"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--heads", "3"], "--heads 3 must divide --hidden 64"),
    (["--tp", "4", "--heads", "2", "--batch-size", "8"], "--tp 4 must divide the number of attention heads (2)"),
    (["--tp", "4", "--sequence-parallel", "--seq-len", "30"], "must divide the sequence length (30)"),
    (["--dropout", "1.5"], "--dropout must be in [0, 1)"),
    (["--dtype", "float16"], "invalid choice: 'float16'"),
    (["--optimizer", "adam"], "invalid choice: 'adam'"),
    (["--model", "gpt3"], "invalid choice: 'gpt3'"),
    (["--pp", "2", "--partition", "3,3"], "need 2 non-negative block counts summing to 4 layers"),
    (["--init-from", "/no/such/model.safetensors"], "--init-from: /no/such/model.safetensors not found"),
    (["--order", "tp-tp-pp"], "must name tp, pp and dp once"),
    (["--vocab", "10"], "the data has 32 token ids but the model's vocabulary is 10"),
    (["--backend", "tpu"], "--backend must be numpy or cupy"),
    (["--model", "mlp", "--sequence-parallel"], "needs a GPT model"),
    (["--grad-clip", "-1"], "--grad-clip must not be negative"),
    (["--bucket-mb", "0"], "--bucket-mb must be positive"),
    (["--steps", "ten"], "invalid int value: 'ten'"),
]


@pytest.mark.parametrize("flags, message", BAD_INPUT, ids=[" ".join(f)[:40] for f, _ in BAD_INPUT])
def test_bad_input_is_one_clear_line(tmp_path, flags, message):
    flags = list(flags)
    if flags[0] == "--config" and "::" in flags[1]:
        path, text = flags[1].split("::")
        flags[1] = bad_config_file(tmp_path, text)
    proc, seconds = run_mpi(4, hpcpar() + ["train"] + FAST + flags, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, proc.stdout
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert lines[0].startswith("hpcpar: error:") and "Traceback" not in proc.stderr
    assert seconds < 20


def test_debug_shows_the_traceback():
    proc, _ = run_mpi(1, hpcpar() + ["--debug", "train"] + FAST + ["--tp", "2"], timeout=60)
    assert proc.returncode == 2 and "Traceback" in proc.stderr


@pytest.mark.parametrize("n", [4, 8])
def test_exception_on_one_rank_mid_step_ends_the_job(tmp_path, n):
    layout = ["--tp", "2", "--pp", "2"] + (["--dp", "2"] if n == 8 else [])
    proc, seconds = run_mpi(n, hpcpar() + ["train"] + FAST + layout + ["--steps", "50"], timeout=90,
                            env={"HPCPAR_FAULT": "step:2@1"}, cwd=tmp_path)   # its flight record lands there
    assert proc.returncode != 0
    assert "injected fault at step 2" in proc.stderr
    assert seconds < 30


def wait_for_lines(path, n, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return True
        time.sleep(0.2)
    return False


def start_long_run(tmp_path, n, extra=()):
    metrics = tmp_path / "m.jsonl"
    cmd = mpiexec(n) + hpcpar() + ["train"] + FAST + ["--steps", "100000", "--metrics", str(metrics)] + list(extra)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)             # the run directory of flight records (no --save)
    assert wait_for_lines(metrics, 2), "the run did not start"
    return proc, metrics


def test_killing_one_rank_ends_the_whole_job(tmp_path):
    proc, _ = start_long_run(tmp_path, 8, ["--tp", "2", "--pp", "2", "--dp", "2"])
    ranks = subprocess.run(["pgrep", "-f", str(tmp_path / "m.jsonl")], capture_output=True, text=True).stdout.split()
    ranks = [int(r) for r in ranks if int(r) != proc.pid]
    start = time.monotonic()
    os.kill(max(ranks), signal.SIGKILL)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the job outlived a killed rank by 30 s")
    assert proc.returncode != 0
    assert time.monotonic() - start < 30


def test_preemption_signal_checkpoints_and_exits_3(tmp_path):
    ck = tmp_path / "ck"
    proc, metrics = start_long_run(tmp_path, 4, ["--pp", "2", "--save", str(ck)])
    proc.send_signal(signal.SIGUSR1)                   # mpiexec forwards it to every rank
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert "stopped by a signal" in err
    done = int((ck / "latest").read_text().strip().split("-")[1])
    assert done >= 2
    again, _ = run_mpi(4, hpcpar() + ["train"] + FAST + ["--pp", "2", "--steps", str(done + 2),
                                                        "--resume", str(ck)], timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"resumed from {ck}/step-{done:08d} after step {done}" in again.stdout


def test_full_disk_names_the_file_and_keeps_the_previous_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    first, _ = run_mpi(4, hpcpar() + ["train"] + FAST + ["--steps", "2", "--pp", "2", "--save", str(ck)], timeout=120)
    assert first.returncode == 0, first.stderr
    proc, seconds = run_mpi(4, hpcpar() + ["train"] + FAST + ["--steps", "4", "--pp", "2", "--resume", str(ck)],
                            timeout=120, env={"HPCPAR_FAULT": "write@2"})
    assert proc.returncode != 0
    assert "No space left on device" in proc.stderr and "rank-00002.safetensors" in proc.stderr
    assert (ck / "latest").read_text() == "step-00000002\n"
    assert not any(p.name.endswith(".partial") and any(p.iterdir()) and (p / "manifest.json").exists()
                   for p in ck.iterdir())


def test_non_finite_loss_stops_with_the_last_good_step_saved(tmp_path):
    ck = tmp_path / "ck"
    proc, _ = run_mpi(2, hpcpar() + ["train"] + FAST + ["--steps", "10", "--lr", "1e30", "--save", str(ck)],
                      timeout=120)
    assert proc.returncode == 1 and "non-finite loss" in proc.stderr
    assert (ck / "latest").read_text() == "step-00000001\n"
    skip, _ = run_mpi(2, hpcpar() + ["train"] + FAST + ["--steps", "4", "--lr", "1e30", "--nonfinite", "skip"],
                      timeout=120)
    assert skip.returncode == 0 and "step     4/4" in skip.stdout
