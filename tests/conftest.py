"""Shared test set-up.

Serial tests run with plain ``pytest``; MPI tests run under ``mpiexec -n N python -m pytest
--only-mpi`` (see the Makefile).  Under MPI only rank 0 prints pytest's report; every other rank
stays quiet unless one of its own tests fails, which it then reports with its rank.
"""
import sys

import pytest


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
