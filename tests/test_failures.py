"""Whole-job failure behaviour: launched with mpiexec from a serial test, with hard timeouts."""
import textwrap

from mpitools import hpcpar, run_mpi


def test_exception_on_one_rank_ends_the_whole_job(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(textwrap.dedent("""
        import sys
        from mpi4py import MPI
        from hpcpar.runtime import run_guarded
        def step():
            comm = MPI.COMM_WORLD
            if comm.rank == 2:
                raise RuntimeError("injected fault on rank 2")
            comm.Barrier()          # the other ranks wait here forever unless the job is aborted
        sys.exit(run_guarded(step))
    """))
    import sys
    proc, seconds = run_mpi(4, [sys.executable, str(script)], timeout=60)
    assert proc.returncode != 0
    assert "injected fault on rank 2" in proc.stderr
    assert seconds < 30


def test_world_mismatch_is_one_line_on_every_rank():
    proc, seconds = run_mpi(6, hpcpar() + ["grid", "--tp", "4", "--pp", "2", "--dp", "1"], timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "hpcpar: error: tp x pp x dp = 4 x 2 x 1 = 8 does not match the world size 6"]
    assert seconds < 10


def test_bad_flag_is_refused():
    proc, _ = run_mpi(2, hpcpar() + ["grid", "--tp", "two"], timeout=30)
    assert proc.returncode == 2
    assert "invalid int value" in proc.stderr and "Traceback" not in proc.stderr


def test_demo_self_check_on_8_ranks():
    proc, _ = run_mpi(8, hpcpar() + ["demo", "--steps", "2", "--model", "tiny"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "self-check: OK" in proc.stdout
    assert "hpcpar train: 2 steps, tiny model, tp 2 x pp 2 x dp 2 = 8 ranks" in proc.stdout
