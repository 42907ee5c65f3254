"""Helpers for tests: launching whole MPI jobs from a serial test, and checking sharded arrays."""
import os
import subprocess
import sys
import time

import numpy as np

from hpcpar import launch


def mpiexec(n):
    """The launcher the Makefile uses (HPCPAR_MPIEXEC), else the venv's mpiexec."""
    return launch.mpiexec() + ["-n", str(n)]


def hpcpar():
    return [sys.executable, "-m", "hpcpar"]


def run(cmd, timeout=60, env=None, cwd=None):
    """Run a command; returns (CompletedProcess, seconds). A hang fails the test, never CI."""
    full_env = dict(os.environ, **(env or {}))
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
    return proc, time.monotonic() - start


def in_process(capfd, args):
    """``hpcpar ARGS`` through the command line's main() in this process (every rank of the session's
    world): (exit status, stderr).  Cheaper than a process per case where neither signals nor several
    launches are the point."""
    from hpcpar.cli import main
    capfd.readouterr()
    try:
        status = main([str(a) for a in args])
    except SystemExit as done:                   # argparse's refusals, and a fault's abort on one rank
        status = done.code
    return status, capfd.readouterr().err


def run_mpi(n, args, timeout=60, env=None, cwd=None):
    """``mpiexec -n n <args>``; args is a list (e.g. hpcpar() + [...])."""
    return run(mpiexec(n) + list(args), timeout=timeout, env=env, cwd=cwd)


def assert_shard_and_whole(comm, local, full, axis, rtol=1e-12, atol=0.0, what="array"):
    """heat-style check of a sharded array: this rank's shard is its slice of ``full``, and the
    shards gathered along ``axis`` over ``comm`` give ``full`` back."""
    n = comm.size
    expected = np.split(full, n, axis=axis)[comm.rank]
    np.testing.assert_allclose(local, expected, rtol=rtol, atol=atol, err_msg=f"{what}: shard")
    whole = comm.all_gather(np.ascontiguousarray(local), axis=axis)
    np.testing.assert_allclose(whole, full, rtol=rtol, atol=atol, err_msg=f"{what}: gathered")
