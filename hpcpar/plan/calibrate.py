"""Calibration: measure this machine into a hardware profile, or fit a profile's GEMM factor.

``hpcpar plan calibrate`` measures what the planner needs to predict a local ``hpcpar train`` run:

* the GEMM rate of numpy's matmul at a few shapes, float32 and float64 (hpcpar.flops.gemm_rate; they
  become the size classes), and the
  memory bandwidth of an element-wise pass (``a + b`` over arrays larger than the caches);
* MPI latency and bandwidth: ``mpiexec -n 2`` of ``hpcpar.plan.pingpong`` (half a round trip of a
  tiny message, and of a large one, through hpcpar.comm).

and writes a profile TOML usable as ``--hardware PATH`` (one "node" of ``--gpus-per-node`` ranks).

``fit_calibration`` sets the one factor a vendor profile has on its GEMM rates: the factor c that
makes the planner's predicted step times of the hardware's calibration runs (published.py) right on
geometric average.  Step time is nearly proportional to 1/c (compute dominates), so the fixed-point
iteration c <- c / mean(predicted throughput / published) converges in a few rounds.
"""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from hpcpar.runtime import UsageError

GEMM_SIZES = (64, 128, 256, 512, 1024)      # square n x n x n matmuls
STREAM_BYTES = 64 * 2**20                    # element-wise pass over arrays well past any cache


def fit_calibration(runs, rounds=4):
    """The GEMM factor for the hardware of ``runs`` (all calibration rows of one profile)."""
    from hpcpar.plan.validate import predict
    c = 1.0
    for _ in range(rounds):
        predicted = [predict(r, c) for r in runs]
        logs = [math.log(r.published_step(e.job.model) / e.step) for r, e in zip(runs, predicted)]
        c /= math.exp(sum(logs) / len(logs))
    return c


def stream_bandwidth(repeat=5):
    """Bytes/s of c = a + b (two reads and a write) on float64 arrays larger than the caches."""
    import numpy as np
    a = np.ones(STREAM_BYTES // 8)
    b, c = a.copy(), np.empty_like(a)
    best = min(_timed(lambda: np.add(a, b, out=c)) for _ in range(repeat))
    return 3 * a.nbytes / best


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def mpi_pingpong(timeout=120):
    """(latency s, bandwidth B/s) between two ranks, from hpcpar.plan.pingpong under mpiexec -n 2."""
    launcher = os.environ.get("HPCPAR_MPIEXEC") or str(Path(sys.executable).parent / "mpiexec")
    cmd = launcher.split() + ["-n", "2", sys.executable, "-m", "hpcpar.plan.pingpong"]
    env = dict(os.environ, **SINGLE_THREAD)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=True)
    except (OSError, subprocess.SubprocessError) as err:
        raise UsageError(f"could not run {' '.join(cmd)}: {err}") from None
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["latency"], result["bandwidth"]


SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def compute_rates():
    """{dtype: {n: FLOP/s}} and the element-wise bandwidth, measured in this process."""
    from hpcpar.flops import gemm_rate
    rates = {dt: {n: gemm_rate(dt, n, seconds=0.3) for n in GEMM_SIZES} for dt in ("float32", "float64")}
    return rates, stream_bandwidth()


def measure(gpus_per_node=2):
    """Measure this machine -> the text of a hardware profile TOML.

    The rates are measured with one BLAS thread, in a child process: every rank of an MPI job runs
    single-threaded (runtime.set_launch_defaults), so that is the rate one rank gets."""
    child = subprocess.run([sys.executable, "-m", "hpcpar.plan.calibrate"], capture_output=True, text=True,
                           env=dict(os.environ, **SINGLE_THREAD), check=True, timeout=600)
    rates, bandwidth = json.loads(child.stdout)
    rates = {dt: {int(n): r for n, r in per.items()} for dt, per in rates.items()}
    peak = {dt: max(r.values()) for dt, r in rates.items()}
    # size classes in GFLOP from the float32 measurements: share of the best rate at each size
    classes = sorted(((2 * n**3 / 1e9, rates["float32"][n] / peak["float32"]) for n in GEMM_SIZES),
                     reverse=True)
    classes[-1] = (0, classes[-1][1])
    latency, link = mpi_pingpong()
    return profile_text(peak, classes, bandwidth, latency, link, gpus_per_node)


def profile_text(peak, classes, bandwidth, latency, link, gpus_per_node):
    import platform
    lines = [
        f"# Measured by `hpcpar plan calibrate` on {platform.node()} ({platform.processor() or platform.machine()}),",
        f"# {time.strftime('%Y-%m-%d %H:%M')}: numpy matmul, an element-wise pass, MPI ping-pong (2 ranks).",
        'name = "local"',
        'description = "this machine, one MPI rank per core, numpy"',
        f"gpus_per_node = {gpus_per_node}",
        "memory_GiB = %.1f" % (_memory_bytes() / 2**30),
        "reserved_GiB = 0.5",
        f"memory_bandwidth_GBps = {bandwidth / 1e9:.2f}",
        "# share of the best measured float32 rate by GEMM size (GFLOP)",
        "gemm_efficiency = [" + ", ".join(f"[{g:.4g}, {f:.3f}]" for g, f in classes) + "]",
        "memory_efficiency = [[0, 1.0]]   # the bandwidth above is already measured",
        "calibration = 1.0",
        "",
        "[peak_tflops]   # best measured matmul rate",
        f"fp32 = {peak['float32'] / 1e12:.5f}",
        f"fp64 = {peak['float64'] / 1e12:.5f}",
        "",
        "[intra_node]    # MPI between two ranks of this machine (measured)",
        f"bandwidth_GBps = {link / 1e9:.3f}",
        f"latency_us = {latency * 1e6:.2f}",
        "efficiency = 1.0",
        "",
        "[inter_node]    # no second machine was measured: the same link",
        f"bandwidth_GBps = {link / 1e9:.3f}",
        f"latency_us = {latency * 1e6:.2f}",
        "efficiency = 1.0",
    ]
    return "\n".join(lines) + "\n"


def _memory_bytes():
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


if __name__ == "__main__":      # the single-threaded child of measure()
    print(json.dumps(compute_rates()))
