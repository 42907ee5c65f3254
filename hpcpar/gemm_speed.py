"""How fast this machine multiplies matrices: the denominators of MFU and of the planner's profiles.

Two measures of the same n x n x n numpy multiply: the best single run (``gemm_rate``: what one core
can do) and the sustained rate of back-to-back runs (``gemm_throughput``: run on every rank at once,
what the ranks get together when they share cores).
"""
import time

import numpy as np


def gemm_rate(dtype="float32", n=512, seconds=0.2, clock=time.perf_counter):
    """FLOP/s of an n x n x n matrix multiply in numpy on this process (best of repeated runs).
    ``clock``: wall time by default; the benchmarks pass ``time.process_time`` (CPU seconds)."""
    a = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
    b = a.copy()
    a @ b                                                   # warm-up: page faults, BLAS start-up
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = clock()
        a @ b
        best = min(best, clock() - t)
    return 2.0 * n ** 3 / best


def gemm_throughput(dtype="float32", n=512, seconds=0.3):
    """Sustained FLOP/s of n x n x n multiplies: as many as fit in ``seconds`` of wall time.  Run on
    every rank at once, the sum over ranks is what the machine delivers to them together (ranks that
    share a core share its rate) - the denominator of an honest utilisation when ranks outnumber cores.
    ``gemm_rate``'s best single multiply would credit every rank with a whole core."""
    a = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
    b = a.copy()
    a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2.0 * n ** 3 * count / (time.perf_counter() - start)
