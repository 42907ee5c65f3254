"""Calibration: measure this machine into a hardware profile, or fit a profile's GEMM factor.

``hpcpar plan calibrate`` measures what the planner needs to predict a local ``hpcpar train`` run:

* the GEMM rate of numpy's matmul at a few shapes, float32 and float64 (hpcpar.gemm_speed.gemm_rate; they
  become the size classes), and the memory bandwidth of an element-wise pass (``a + b`` over arrays
  larger than the caches) - the GPU-style part of the profile, for ``hpcpar plan --hardware``;
* MPI through hpcpar.comm between two ranks: point-to-point latency and bandwidth and the bucketed
  data-parallel all-reduce (``mpiexec -n 2`` of ``hpcpar.tools.plan.pingpong``);
* the engine itself (cpu.py): a few short training steps of shapes unlike the presets - PROBES on one
  rank, TP_PROBES on two tensor-parallel ranks, PP_PROBE as a two-stage pipeline - each in a fresh
  process (probe.py), and the least-squares fit of cpu.py's constants to them; the tensor-parallel
  all-reduce's alpha-beta is fitted to the collectives inside those steps (seconds = alpha * calls +
  bytes / beta).

A probe that another job slowed down (CPU time below 90 % of wall time on a rank) is run again, up to
ATTEMPTS times, and the fastest attempt counts: other work can only make a run slower.  The profile
TOML is usable as ``--hardware PATH`` and by ``local.predict_local``.

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
from dataclasses import replace

from hpcpar.launch import mpiexec, single_thread_env
from hpcpar.runtime import UsageError

GEMM_SIZES = (64, 128, 256, 512, 1024)      # square n x n x n matmuls
STREAM_BYTES = 64 * 2**20                    # element-wise pass over arrays well past any cache
ATTEMPTS = 3
QUIET = 0.9                                  # CPU time / wall time of a probe step undisturbed

# (layers, hidden, heads, seq_len, ffn, batch, micro-batches): shapes around, but none equal to, the
# tiny and small presets - widths 64 to 256, 1 to 3 blocks, 4 to 32 sequences, scores per token from
# 1 to 4 times the width, MLP 2 to 8 times the width - so that the terms of cpu.py separate; and two
# with almost no arithmetic (1 and 4 blocks of width 16, 8 tokens): the fixed costs.
PROBES = [(1, 128, 4, 64, 512, 8, 1), (3, 128, 4, 64, 512, 8, 1), (2, 64, 4, 32, 256, 32, 1),
          (2, 128, 8, 128, 256, 4, 1), (1, 256, 8, 64, 1024, 8, 1), (3, 64, 2, 64, 512, 16, 2),
          (2, 96, 4, 96, 384, 8, 2), (1, 16, 2, 8, 64, 1, 1), (4, 16, 2, 8, 64, 1, 1)]
TP_PROBES = PROBES[0], PROBES[2], PROBES[4]   # also run with tp = 2
PP_PROBE = (2, 128, 4, 64, 512, 16, 4)         # run with pp = 2: cpu.py's "warm"


def fit_calibration(runs, rounds=4):
    """The GEMM factor for the hardware of ``runs`` (all calibration rows of one profile)."""
    from hpcpar.tools.plan.validate import predict
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


def _child(args, ranks=1, timeout=300):
    """Run ``python -m args...`` (under mpiexec -n ranks if > 1) single-threaded; its last JSON line."""
    cmd = (mpiexec() + ["-n", str(ranks)] if ranks > 1 else []) + [sys.executable, "-m"] + args
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True,
                             env=dict(os.environ, **single_thread_env()))
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or ""
        raise UsageError(f"could not run {' '.join(cmd)}: {err} {detail.strip()[-500:]}") from None
    return json.loads(out.stdout.strip().splitlines()[-1])


def mpi_pingpong():
    """{latency, bandwidth, dp_latency, dp_bandwidth} between two ranks (hpcpar.tools.plan.pingpong)."""
    return _child(["hpcpar.tools.plan.pingpong"], ranks=2, timeout=120)


def compute_rates():
    """{dtype: {n: FLOP/s}} and the element-wise bandwidth, measured in this process."""
    from hpcpar.gemm_speed import gemm_rate
    rates = {dt: {n: gemm_rate(dt, n, seconds=0.2) for n in GEMM_SIZES} for dt in ("float32", "float64")}
    return rates, stream_bandwidth()


def probe_options(shape, dtype, tp=1, pp=1):
    layers, hidden, heads, seq_len, ffn, batch, micro = shape
    return dict(dtype=dtype, tp=tp, pp=pp, layers=layers, hidden=hidden, heads=heads, seq_len=seq_len,
                ffn=ffn, batch_size=batch, microbatches=micro)


def run_probe(options):
    """The fastest of up to ATTEMPTS runs of one probe; the first quiet one ends the attempts."""
    best = None
    for _ in range(ATTEMPTS):
        r = _child(["hpcpar.tools.plan.probe", json.dumps(options)], ranks=options["tp"] * options["pp"])
        if best is None or r["step"] < best["step"]:
            best = r
        if r["cpu"] >= QUIET:
            break
    return best


def probe_pass(options):
    """The cpu.Pass of rank 0 of a probe: the first stage (all of it when pp = 1)."""
    from hpcpar.nn.gpt import preset
    from hpcpar.tools.plan.cpu import Pass
    from hpcpar.tools.plan.local import engine_shape
    o = options
    cfg = preset("tiny", n_layer=o["layers"], d_model=o["hidden"], n_head=o["heads"], seq_len=o["seq_len"],
                 d_ff=o["ffn"])
    return Pass(engine_shape(cfg, "probe"), o["seq_len"], o["batch_size"] // o["microbatches"],
                o["layers"] // o["pp"], o["tp"], first=True, last=o["pp"] == 1)


def allreduce_fit(comm_rows, pingpong_bandwidth):
    """The TP all-reduce's (alpha, beta, source) from the collectives inside the probe steps:
    seconds = alpha * calls + bytes / beta, fitted with non-negative coefficients.

    On a busy machine the bytes can explain none of the spread in the timings: the fitted slope
    1/beta comes out 0 (a negative one is clipped to 0) and beta would be infinite.  Then beta is the
    ping-pong bandwidth measured between the same two ranks and alpha is fitted alone with it;
    ``source`` says which ("probes" or "ping-pong")."""
    from hpcpar.tools.plan.cpu import fit_relative
    seconds = [c["seconds"] for c in comm_rows]
    (alpha, inv_beta), _ = fit_relative([[c["calls"], c["bytes"]] for c in comm_rows], seconds)
    if inv_beta > 0:
        return alpha, 1 / inv_beta, "probes"
    if not 0 < pingpong_bandwidth < math.inf:
        raise UsageError(f"calibrate: no usable all-reduce bandwidth (probe fit slope {inv_beta:g}, ping-pong "
                         f"{pingpong_bandwidth:g} B/s): the machine was too busy; rerun when it is idle")
    (alpha,), _ = fit_relative([[c["calls"]] for c in comm_rows], seconds,
                               known=[c["bytes"] / pingpong_bandwidth for c in comm_rows])
    return alpha, pingpong_bandwidth, "ping-pong"


def fit_engine(peak, pingpong_bandwidth):
    """Run the probes and fit cpu.py's constants -> {"costs": CpuCosts per dtype, "allreduce": TP
    (alpha, beta, source) (allreduce_fit), "rms": {dtype: (forward, backward, rest) relative rms of
    the fits}, "cpu": the lowest CPU share of the probe steps used}."""
    from hpcpar.tools.plan.cpu import REST, CpuCosts, fit_passes, fit_relative, fit_warm
    out = {"costs": {}, "rms": {}, "cpu": 1.0}
    comm_rows = []
    for dtype in ("float32", "float64"):
        options = [probe_options(s, dtype) for s in PROBES] + [probe_options(s, dtype, tp=2) for s in TP_PROBES]
        runs = [(o, run_probe(o)) for o in options + [probe_options(PP_PROBE, dtype, pp=2)]]
        *runs, (pp, pipe) = runs
        (fwd, rms_f), (bwd, rms_b) = fit_passes([(probe_pass(o), r["F"], r["B"]) for o, r in runs], peak[dtype])
        one = [r for o, r in runs if o["tp"] == 1]
        rest, rms_r = fit_relative([[1, r["m"], r["params"]] for r in one], [r["rest"] for r in one])
        costs = CpuCosts(peak[dtype], fwd, bwd, dict(zip(REST, rest)))
        out["costs"][dtype] = replace(costs, warm=fit_warm(costs, probe_pass(pp), pipe["F"], pipe["m"]))
        out["rms"][dtype] = (rms_f, rms_b, rms_r)
        out["cpu"] = min([out["cpu"], pipe["cpu"]] + [r["cpu"] for _, r in runs])
        comm_rows += [r["comm"] for o, r in runs if o["tp"] > 1]
    out["allreduce"] = allreduce_fit(comm_rows, pingpong_bandwidth)
    if out["allreduce"][2] != "probes":
        print("calibrate: the probes' all-reduce timings gave no bandwidth term (a busy machine?): "
              "using the MPI ping-pong bandwidth", file=sys.stderr)
    return out


def measure(gpus_per_node=2):
    """Measure this machine -> the text of a hardware profile TOML.

    The rates are measured with one BLAS thread, in a child process: every rank of an MPI job runs
    single-threaded (runtime.set_launch_defaults), so that is the rate one rank gets."""
    rates, bandwidth = _child(["hpcpar.tools.plan.calibrate"], timeout=600)
    rates = {dt: {int(n): r for n, r in per.items()} for dt, per in rates.items()}
    peak = {dt: max(r.values()) for dt, r in rates.items()}
    # size classes in GFLOP from the float32 measurements: share of the best rate at each size
    classes = sorted(((2 * n**3 / 1e9, rates["float32"][n] / peak["float32"]) for n in GEMM_SIZES),
                     reverse=True)
    classes[-1] = (0, classes[-1][1])
    mpi = mpi_pingpong()
    fit = fit_engine(peak, mpi["bandwidth"])
    return profile_text(peak, classes, bandwidth, mpi, gpus_per_node) + engine_text(mpi, fit)


def profile_text(peak, classes, bandwidth, mpi, gpus_per_node):
    import platform
    link = [f"bandwidth_GBps = {mpi['bandwidth'] / 1e9:.3f}", f"latency_us = {mpi['latency'] * 1e6:.2f}",
            "efficiency = 1.0"]
    lines = [
        f"# Measured by `hpcpar plan calibrate` on {platform.node()} ({platform.processor() or platform.machine()}),",
        f"# {time.strftime('%Y-%m-%d %H:%M')}: numpy matmul, an element-wise pass, MPI between 2 ranks, and",
        "# probes of the engine itself (hpcpar/tools/plan/calibrate.py).",
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
        "[intra_node]    # MPI ping-pong between two ranks of this machine (hpcpar/tools/plan/pingpong.py)",
        *link,
        "",
        "[inter_node]    # no second machine was measured: the same link",
        *link,
    ]
    return "\n".join(lines) + "\n"


def engine_text(mpi, fit):
    """The [engine] tables: hpcpar's own costs on this machine (cpu.py, local.py)."""
    alpha, beta, source = fit["allreduce"]
    lines = [
        "",
        "# hpcpar's engine on this machine (hpcpar/tools/plan/cpu.py), fitted to short training steps (probe.py)",
        "[engine]",
        f"allreduce_latency_us = {alpha * 1e6:.2f}   # TP all-reduce inside a step: alpha * calls + bytes / beta",
        f"allreduce_GBps = {beta / 1e9:.3f}" + ("" if source == "probes" else
                                               "   # the MPI ping-pong's: the probes' timings gave no slope"),
        f"dp_latency_us = {mpi['dp_latency'] * 1e6:.2f}      # DP gradient buckets: iall_reduce_ + wait_all",
        f"dp_GBps = {mpi['dp_bandwidth'] / 1e9:.3f}",
        f"probe_cpu_share = {fit['cpu']:.3f}   # lowest CPU / wall time of a probe; below {QUIET}: disturbed",
    ]
    for dtype, c in fit["costs"].items():
        rms = fit["rms"][dtype]
        lines += ["", f"[engine.{dtype}]   # per pass [forward, backward]; fit rms: F {rms[0]:.1%}, "
                      f"B {rms[1]:.1%}, rest {rms[2]:.1%}", *c.table_lines()]
    return "\n".join(lines) + "\n"


def _memory_bytes():
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


if __name__ == "__main__":      # the single-threaded child of measure()
    print(json.dumps(compute_rates()))
