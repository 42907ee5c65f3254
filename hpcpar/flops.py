"""How much arithmetic a step is, and how fast this machine multiplies matrices.

Model FLOPs of one training step of a GPT (forward + backward, no recomputation; Narayanan et al.
2021, eq. 3, generalised to any feed-forward width F):

    per token and layer:  forward 2 (4 C^2 + 2 C F) for the GEMMs + 4 T C for attention (QK^T and PV)
    per token, head:      forward 2 C V
    training = 3 x forward (backward costs two forwards)

For F = 4C this is 72 B T L C^2 (1 + T/(6C) + V/(12 L C)), the formula in docs/design.md (FLOPs).
"""
import time

import numpy as np


def gpt_step_flops(cfg, tokens):
    C, F, L, V, T = cfg.d_model, cfg.d_ff, cfg.n_layer, cfg.vocab_size, cfg.seq_len
    per_token = L * (2 * (4 * C * C + 2 * C * F) + 4 * T * C) + 2 * C * V
    return 3 * per_token * tokens


def mlp_step_flops(cfg, samples):
    C, F = cfg.d_model, cfg.d_ff
    per_sample = 2 * (cfg.d_in * C + cfg.n_layer * 2 * C * F + C * cfg.d_out)
    return 3 * per_sample * samples


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
