"""A hung or dead rank is found and named, and the job ends (docs/reliability.md, "When a job hangs").

Whole 8-rank jobs (tp 2 x pp 2 x dp 2) launched with mpiexec from serial tests, with hard timeouts:
one rank stopped (SIGSTOP), killed (SIGKILL), or stopped and then the job told to stop (SIGTERM) -
each for a rank in the first and one in the last pipeline stage. Small deadlines keep the set cheap.
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mpitools import hpcpar, mpiexec, run
from test_reliability import FAST, wait_for_lines

DOC = Path(__file__).resolve().parent.parent / "docs" / "reliability.md"
LAYOUT = ["--tp", "2", "--pp", "2", "--dp", "2"]
COORDS = {2: "tp 0, pp 0, dp 1", 5: "tp 1, pp 1, dp 0"}    # rank = tp + 2 dp + 4 pp: stage 0 and stage 1
SHUTDOWN_S = 3


def documented(command):
    """The argument list of the line of the docs' "When a job hangs" section that starts with ``command``."""
    section = DOC.read_text().split("## When a job hangs", 1)[1]
    line = next(ln for ln in section.splitlines() if ln.startswith(command))
    return shlex.split(line)


def rank_processes(marker, world=8, timeout=30):
    """{rank: pid} of the MPI ranks: each is the child of the guard process mpiexec started."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pids = {int(p) for p in subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()}
        ranks = {}
        for pid in pids:
            try:
                parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = [v for v in env if v.startswith(b"PMI_RANK=")]
            if parent in pids and rank:
                ranks[int(rank[0].split(b"=")[1])] = pid
        if len(ranks) == world:
            return ranks
        time.sleep(0.2)
    raise AssertionError(f"did not find {world} ranks of {marker}")


class Job:
    """`hpcpar train` on 8 ranks with a run directory, running until its second step is done."""

    def __init__(self, tmp_path, flags):
        self.run_dir, metrics = tmp_path / "run", tmp_path / "m.jsonl"
        cmd = mpiexec(8) + hpcpar() + ["train"] + flags + ["--metrics", str(metrics), "--save", str(self.run_dir)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert wait_for_lines(metrics, 2), "the run did not start"
            self.ranks = rank_processes(str(metrics))
        except BaseException:               # no job left running: its ranks sit in sessions of their own
            self.kill(map(int, subprocess.run(["pgrep", "-f", str(metrics)], capture_output=True,
                                              text=True).stdout.split()))
            raise

    def kill(self, pids):
        """SIGKILL to ``pids`` and to the launcher, and wait for the launcher."""
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.kill()
        self.proc.communicate()

    def finish(self, limit):
        """(exit status, stderr, seconds from now until the job ended); fails after ``limit`` seconds."""
        start = time.monotonic()
        try:
            _, err = self.proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            self.kill(self.ranks.values())
            pytest.fail(f"the job outlived its deadline of {limit} s")
        return self.proc.returncode, err, time.monotonic() - start

    def why(self):
        proc, _ = run(hpcpar() + ["trace", "why", str(self.run_dir / "flight")], timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout


def train_flags(*extra):
    return FAST + LAYOUT + ["--steps", "100000"] + list(extra)


@pytest.mark.parametrize("victim", sorted(COORDS))
def test_a_stopped_rank_is_named_and_the_job_ends(tmp_path, victim):
    flags = documented(".venv/bin/mpiexec -n 8 .venv/bin/hpcpar train")
    flags = flags[flags.index("train") + 1:]
    hang_s = float(flags[flags.index("--hang-timeout") + 1])
    run_dir_at = flags.index("--save")
    flags = flags[:run_dir_at] + flags[run_dir_at + 2:]        # the test's own run directory instead
    job = Job(tmp_path, flags)
    os.kill(job.ranks[victim], signal.SIGSTOP)
    status, err, seconds = job.finish(hang_s + 30)
    assert status == 1, err
    assert seconds < hang_s + 30
    # the summary is among the last lines: after the watchdog's "...; ending the job" line, before the
    # flight-record line; MPI's own abort message may come before or after them (its timing varies)
    last = err.strip().splitlines()[-4:]
    summary = next((line for line in last if line.startswith("hpcpar: rank") and
                    not line.endswith("; ending the job")), None)
    assert summary, err
    assert summary.startswith(f"hpcpar: rank {victim} ({COORDS[victim]}) stopped in step "), err
    assert re.search(r"waits? in the (tp|pp|dp|world) ", summary), summary
    why = job.why()                     # the same culprit, from the files (later records may add waiters)
    assert why.split(";")[0] == summary[len("hpcpar: "):].split(";")[0]
    assert documented(".venv/bin/hpcpar trace why")[-1] == "runs/hang/flight"


@pytest.mark.parametrize("victim", sorted(COORDS))
def test_a_killed_rank_is_named_first(tmp_path, victim):
    job = Job(tmp_path, train_flags("--hang-timeout", "30"))
    os.kill(job.ranks[victim], signal.SIGKILL)
    status, err, seconds = job.finish(30)
    assert status != 0 and seconds < 30
    first = err.strip().splitlines()[0]
    assert re.fullmatch(rf"hpcpar: rank {victim} \({COORDS[victim]}\) was killed by signal 9 \(SIGKILL\) "
                        r"in step \d+.*", first), err
    why = job.why()
    assert why.startswith(f"rank {victim} ({COORDS[victim]}) was killed by signal 9 (SIGKILL)"), why
    assert " wait in the " in why or " waits in the " in why, why


@pytest.mark.parametrize("victim", sorted(COORDS))
def test_stop_signal_with_a_stalled_rank_ends_within_the_shutdown_timeout(tmp_path, victim):
    job = Job(tmp_path, train_flags("--save-every", "1", "--shutdown-timeout", str(SHUTDOWN_S)))
    assert wait_for_lines(job.run_dir / "latest", 1), "no checkpoint"
    os.kill(job.ranks[victim], signal.SIGSTOP)
    job.proc.send_signal(signal.SIGTERM)                     # mpiexec hands it to every rank
    status, err, seconds = job.finish(SHUTDOWN_S + 30)
    assert status == 1 and seconds < SHUTDOWN_S + 30, err
    assert f"the shutdown timeout of {SHUTDOWN_S} s" in err
    why = job.why()
    assert why.startswith(f"rank {victim} ({COORDS[victim]}) stopped"), why
    assert re.search(r"; ranks? [-,\d]+ (waits? in|are in|is in) ", why), why
    latest, _ = run(hpcpar() + ["checkpoint", "inspect", str(job.run_dir)], timeout=60)
    assert latest.returncode == 0 and "all checksums verified" in latest.stdout, latest.stdout + latest.stderr


def test_a_segfault_is_named_by_the_guard(tmp_path):
    """The guard alone (no training): rank 1 of 2 crashes in step 7, micro-batch 1."""
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(f"""
        import ctypes
        from hpcpar.watch import rank_guard
        rank_guard.split({str(tmp_path / "flight")!r})
        from mpi4py import MPI
        from hpcpar.comm.grid import ParallelGrid
        grid = ParallelGrid(tp=1, pp=2, dp=1)
        rank_guard.page().set_coords(grid.rank_id, grid.world, grid.coords)
        rank_guard.page().set_progress(6, 1)
        grid.world_comm.barrier()
        if grid.rank_id == 1:
            ctypes.string_at(0)                 # a segmentation fault
        grid.world_comm.barrier()
    """))
    proc, seconds = run(mpiexec(2) + [sys.executable, str(script)], timeout=60)
    assert proc.returncode != 0 and seconds < 30
    assert proc.stderr.splitlines()[0] == ("hpcpar: rank 1 (tp 0, pp 1, dp 0) was killed by signal 11 (SIGSEGV) "
                                           "in step 7, micro-batch 1"), proc.stderr
    assert not list(tmp_path.glob("core*"))


@pytest.mark.parametrize("stop", [None, pytest.param("SIGTERM", marks=pytest.mark.slow)])
def test_a_stalled_rank_in_a_run_directory_that_cannot_be_written_still_ends(tmp_path, stop):
    """Two ranks, one stopped, and no flight record or alarm can be written (the run directory read-only,
    or a file where the flight directory would be): the alarm's mkdir used to kill the watchdog thread
    and the job spun for ever, SIGTERM included.  Now each watchdog says what it cannot write and ends the
    job within the hang timeout (or, after SIGTERM, the shutdown timeout) + 30 s."""
    run_dir, metrics, deadline = tmp_path / "run", tmp_path / "m.jsonl", 3
    run_dir.mkdir()
    (run_dir / "flight").write_text("a file where the flight records would go")
    run_dir.chmod(0o555)                     # read-only too (a root user writes there all the same)
    timeouts = ["--hang-timeout", str(deadline)] if stop is None else \
        ["--hang-timeout", "300", "--shutdown-timeout", str(deadline)]
    cmd = mpiexec(2) + hpcpar() + ["train"] + FAST + ["--steps", "100000", "--metrics", str(metrics)] + timeouts
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=run_dir)
    ranks = {}
    try:
        assert wait_for_lines(metrics, 2), "the run did not start"
        ranks = rank_processes(str(metrics), world=2)
        os.kill(ranks[1], signal.SIGSTOP)
        if stop:
            proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        _, err = proc.communicate(timeout=deadline + 30)
        seconds = time.monotonic() - start
    except subprocess.TimeoutExpired:
        for pid in ranks.values():
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()
        pytest.fail(f"the job outlived its deadline of {deadline} + 30 s")
    finally:
        run_dir.chmod(0o755)
    assert proc.returncode == 1 and seconds < deadline + 30, err
    assert "Traceback" not in err, err
    assert "hpcpar: warning: flight records cannot be written in ./flight" in err, err
    assert re.search(r"hpcpar: rank 0 \(tp 0, pp 0, dp 0\): .*; cannot raise the alarm in \./flight \(.*\): ending "
                     r"the job without the other ranks' records", err), err


def test_hpcpar_train_reads_its_options_before_mpi_starts():
    """The rank guard forks before MPI starts (watch/rank_guard.py's split refuses once mpi4py.MPI is
    loaded): what hpcpar train imports before the fork - the option table, the flight directory - loads no
    MPI, or no rank would have a guard to name it."""
    code = ("import sys; from hpcpar.watch import rank_guard; from hpcpar.training.options import config_from; "
            "from hpcpar.watch.watchdog import flight_dir; print('mpi4py.MPI' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["False"], proc.stderr
