"""Shared test set-up.

Serial tests run with plain ``pytest``; MPI tests run under ``mpiexec -n N python -m pytest
--only-mpi`` (see the Makefile).  Under MPI only rank 0 prints pytest's report; every other rank
stays quiet unless one of its own tests fails, which it then reports with its rank.

The session ends with how many reference tests (PyTorch, transformers: reference.py) were skipped and
the command that enables them; with $HPCPAR_TEST_TALLY set, rank 0 also appends the session's counts to
that file, from which tally.py prints the totals of a whole `make test`.
"""
import json
import os
import sys

import pytest

from reference import ENABLE, REASON, WHY_OPTIONAL

# taken out of the environment as the session starts: a pytest that a test starts in a subprocess (the
# course's checks, the docs' commands) must not add its own counts to make test's
TALLY = os.environ.pop("HPCPAR_TEST_TALLY", None)


def _under_mpi(config):
    return config.getoption("--with-mpi", False) or config.getoption("--only-mpi", False)


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if not _under_mpi(config):
        return
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.rank
    if rank == 0:
        return
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        config.pluginmanager.unregister(reporter)

    class _RankFailures:
        def pytest_runtest_logreport(self, report):
            if report.failed:
                print(f"[rank {rank}] FAILED {report.nodeid} ({report.when})\n{report.longreprtext}",
                      file=sys.stderr, flush=True)

    config.pluginmanager.register(_RankFailures(), "rank-failures")


@pytest.fixture(scope="session")
def comm():
    from mpi4py import MPI
    return MPI.COMM_WORLD


def pytest_ignore_collect(collection_path, config):
    """Under ``--only-mpi`` every rank imports every test file: with 8 ranks on 2 cores, importing
    PyTorch and matplotlib for serial-only files cost more than the MPI tests.  Files without an MPI
    test are not imported there."""
    if (config.getoption("--only-mpi", False) and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")):
        return "mark.mpi" not in collection_path.read_text() or None
    return None


def _reference_skips(reporter):
    return sum(1 for r in reporter.stats.get("skipped", [])
               if isinstance(r.longrepr, tuple) and REASON in str(r.longrepr[2]))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Only rank 0 has a terminal reporter (pytest_configure), so this runs once per session."""
    skipped = _reference_skips(terminalreporter)
    if skipped:
        terminalreporter.write_line(f"{skipped} reference tests skipped: PyTorch/transformers not installed; "
                                    f"enable them with `{ENABLE}` ({WHY_OPTIONAL})")
    if TALLY:
        counts = {kind: len(terminalreporter.stats.get(kind, [])) for kind in ("passed", "failed", "error", "skipped")}
        world = sys.modules["mpi4py.MPI"].COMM_WORLD.size if _under_mpi(config) else 0
        with open(TALLY, "a") as f:
            f.write(json.dumps({"world": world, "exit": int(exitstatus), "reference_skipped": skipped,
                                **counts}) + "\n")
