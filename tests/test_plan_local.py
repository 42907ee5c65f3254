"""The CPU cost model and the local step prediction (hpcpar/tools/plan/cpu.py, local.py), on a made-up
profile: no measurement here (test_plan_validation.py calibrates this machine and checks it)."""
import itertools

import numpy as np
import pytest

from hpcpar.cli import main
from hpcpar.tools.plan.cpu import TERMS, CpuCosts, Pass, fit_passes, fit_warm, nnls
from hpcpar.tools.plan.local import engine_shape, explain_local, predict_local
from hpcpar.runtime import UsageError

PROFILE = """
name = "made-up"
gpus_per_node = 2
memory_GiB = 16
memory_bandwidth_GBps = 10
gemm_efficiency = [[0, 1.0]]
memory_efficiency = [[0, 1.0]]
[peak_tflops]
fp32 = 0.1
fp64 = 0.05
[intra_node]
bandwidth_GBps = 10
latency_us = 2
[inter_node]
bandwidth_GBps = 10
latency_us = 2
[engine]
allreduce_latency_us = 10
allreduce_GBps = 2
dp_latency_us = 5
dp_GBps = 5
probe_cpu_share = 1.0
[engine.float32]
gemm_gflops = 100
rep_ns = [10, 20]
split_ns = [5, 5]
soft_ns = [3, 1]
block_us = [80, 120]
end_us = [40, 60]
step_ms = 0.5
microbatch_ms = 0.2
param_ns = 6
warm = 0.6
"""


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "made-up.toml"
    path.write_text(PROFILE)
    return str(path)


def _tiny():
    from hpcpar.nn.gpt import PRESETS
    return engine_shape(PRESETS["tiny"], "tiny")


def test_nnls_is_the_best_non_negative_solution():
    rng = np.random.default_rng(0)
    A, b = rng.random((12, 4)), rng.random(12) - 0.3
    c = nnls(A, b)
    assert (c >= 0).all()
    best = np.sum((A @ c - b) ** 2)
    for trial in itertools.islice(itertools.product(np.linspace(0, 1, 6), repeat=4), None):
        assert np.sum((A @ np.array(trial) - b) ** 2) >= best - 1e-12


def test_fit_recovers_the_constants_of_made_up_probes():
    """Probes timed exactly by known constants give those constants back."""
    truth = CpuCosts(100e9, {"rep": 10e-9, "split": 5e-9, "soft": 3e-9, "block": 80e-6, "end": 40e-6},
                     {"rep": 20e-9, "split": 5e-9, "soft": 1e-9, "block": 120e-6, "end": 60e-6}, {})
    from hpcpar.tools.plan.models import ModelShape
    samples = []
    shapes = [(1, 128, 4, 64, 512, 8, 1), (3, 128, 4, 64, 512, 8, 1), (2, 64, 4, 32, 256, 32, 1),
              (2, 128, 8, 128, 256, 4, 1), (1, 256, 8, 64, 1024, 8, 1), (1, 16, 2, 8, 64, 1, 1),
              (4, 16, 2, 8, 64, 1, 1), (1, 128, 4, 64, 512, 8, 2), (1, 256, 8, 64, 1024, 8, 2)]
    for layers, h, a, s, f, b, tp in shapes:
        p = Pass(ModelShape("p", layers, h, a, 32, ffn=f), s, b, layers, tp)
        samples.append((p, sum(truth.pass_terms(p).values()), sum(truth.pass_terms(p, True).values())))
    (fwd, rms_f), (bwd, rms_b) = fit_passes(samples, 100e9)
    assert rms_f < 1e-9 and rms_b < 1e-9
    for k in TERMS:
        assert fwd[k] == pytest.approx(truth.forward[k], rel=1e-6)
        assert bwd[k] == pytest.approx(truth.backward[k], rel=1e-6)
    p = Pass(_tiny(), 64, 4, 1, 1, first=True, last=False)
    costs = CpuCosts(100e9, truth.forward, truth.backward, {}, warm=0.6)
    m = 4     # first forward fresh, three reuse memory: the mean of the four gives warm back
    mean = sum(costs.pass_terms(p, reused=(m - 1) / m).values())
    assert fit_warm(truth, p, mean, m) == pytest.approx(0.6)


def _collectives(alpha, beta, sizes):
    return [{"calls": calls, "bytes": nbytes, "seconds": alpha * calls + nbytes / beta} for calls, nbytes in sizes]


def test_allreduce_fit_recovers_alpha_beta_and_falls_back_on_a_busy_machine():
    """Timings that follow alpha * calls + bytes / beta give alpha and beta back.  Timings where the
    bytes explain nothing - here they fall as the bytes grow, as when load slowed the small probes -
    fit no slope: beta is the ping-pong's (never an infinite bandwidth) and alpha is fitted with it."""
    from hpcpar.tools.plan.calibrate import allreduce_fit
    sizes = [(10, 1e5), (40, 1e6), (20, 4e6), (80, 2e6)]
    alpha, beta, source = allreduce_fit(_collectives(20e-6, 2e9, sizes), pingpong_bandwidth=5e9)
    assert (alpha, beta, source) == (pytest.approx(20e-6), pytest.approx(2e9), "probes")
    busy = [{"calls": 10, "bytes": 1e5, "seconds": 4e-3}, {"calls": 10, "bytes": 4e6, "seconds": 1e-3}]
    alpha, beta, source = allreduce_fit(busy, pingpong_bandwidth=5e9)
    assert source == "ping-pong" and beta == 5e9 and 0 < alpha < 1e-3
    with pytest.raises(UsageError, match="too busy"):
        allreduce_fit(busy, pingpong_bandwidth=float("inf"))


def test_engine_text_says_where_the_allreduce_bandwidth_came_from():
    from hpcpar.tools.plan.calibrate import engine_text
    mpi = {"dp_latency": 5e-6, "dp_bandwidth": 5e9}
    fit = {"allreduce": (2e-5, 5e9, "ping-pong"), "cpu": 1.0, "costs": {}, "rms": {}}
    text = engine_text(mpi, fit)
    assert "allreduce_GBps = 5.000   # the MPI ping-pong's" in text and "inf" not in text


def test_pass_units_follow_tensor_parallelism():
    one, two = Pass(_tiny(), 64, 16, 2, 1).units(), Pass(_tiny(), 64, 16, 2, 2).units()
    assert two["rep"] == one["rep"] and two["split"] == one["split"] / 2 and two["soft"] == one["soft"] / 2
    assert one["rep"] == 2 * 16 * 64 * 64 and one["block"] == 2 and one["end"] == 2


def test_layouts_of_the_made_up_profile(profile):
    one = predict_local(profile, model="small")
    tp, dp = predict_local(profile, model="small", tp=2), predict_local(profile, model="small", dp=2)
    pp = predict_local(profile, model="small", pp=2, microbatches=4)
    assert 0 < dp.step < one.step and tp.step < one.step and pp.step < one.step
    assert one.dp == 0 and dp.dp > 0 and tp.tp_comm > 0 and one.tp_comm == 0
    # 1F1B, p = 2, m = 4, equal stages: the bubble is (p - 1) / (m + p - 1) of the pipeline
    assert pp.pipeline.bubble == pytest.approx(1 / 5, abs=0.03)
    # the same terms as the sum
    c = one.chunks[0]
    assert one.step == pytest.approx(sum(c.forward.values()) + sum(c.backward.values()) + one.rest)


def test_tp_all_reduces_are_the_engines(profile):
    """Forward 2n + 1 (embedding) + 2 small (the vocab-parallel loss), backward 2n + 1 (the head): the
    12 calls a tiny tp=2 step counts (hpcpar.comm stats)."""
    est = predict_local(profile, model="tiny", tp=2)
    tokens, big = 16 * 64, 16 * 64 * 64 * 4
    ar = lambda n: 10e-6 + n / 2e9    # noqa: E731
    c = est.chunks[0]
    assert c.forward["TP all-reduce"] == pytest.approx(5 * ar(big) + ar(4 * tokens) + ar(8 * tokens))
    assert c.backward["TP all-reduce"] == pytest.approx(5 * ar(big))


def test_explain_and_cli(profile, capsys):
    text = explain_local(predict_local(profile, model="tiny", pp=2, microbatches=4))
    for term in ("GEMM", "rep", "split", "soft", "block", "end", "memory reused", "PIPELINE", "simulated",
                 "REST", "STEP"):
        assert term in text
    assert main(["plan", "local", "--hardware", profile, "--model", "small", "--dtype", "fp32", "--dp", "2"]) == 0
    assert "MB of gradients in buckets" in capsys.readouterr().out


def test_a_local_run_with_cp_selective_recomputation_and_zero(profile, capsys):
    """hpcpar train's --cp 2 --recompute-attention --zero1, as the planner reads them (tools/plan/local.py's
    recompute_policy and zero_stage), are in the layout it reports and in its memory."""
    flags = ["plan", "local", "--hardware", profile, "--model", "tiny", "--dtype", "fp32", "--dp", "2"]
    assert main(flags) == 0
    plain = capsys.readouterr().out
    assert main(flags + ["--cp", "2", "--recompute", "selective", "--zero", "1"]) == 0
    out = capsys.readouterr().out
    assert "LAYOUT tp1-pp1-dp2-mb8-v1-1f1b-cp2-z1-rcsel: cp 2, recomputation selective, ZeRO stage 1" in out

    def memory(text):
        return float(text.split("MEMORY ")[1].split()[0])
    assert memory(out) < memory(plain)


@pytest.mark.parametrize("args, message", [
    (["--model", "mlp"], "--model"),
    (["--dtype", "fp64"], "no [engine.float64]"),
    (["--tp", "3"], "does not divide"),
    (["--pp", "2", "--microbatches", "3"], "does not divide"),
])
def test_local_refusals(profile, capsys, args, message):
    assert main(["plan", "local", "--hardware", profile] + args) == 2
    assert message in capsys.readouterr().err
