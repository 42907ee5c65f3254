"""``hpcpar train --profile``: categories that add up to the step, a GEMM floor, results unchanged,
at one rank in this process and at two ranks (pipeline and data parallel) under mpiexec."""
import re
import time

import numpy as np
import pytest
from mpi4py import MPI

from mpitools import hpcpar, run_mpi
from train_helpers import config

from hpcpar import precision
from hpcpar.ops import layernorm
from hpcpar.training.profiler import Profiler, report
from hpcpar.training.step import Trainer

DIMS = dict(model="tiny", layers=2, hidden=32, heads=4, seq_len=16, synthetic_vocab=29, batch_size=4)


def profiled_steps(steps, clock=time.perf_counter):
    t = Trainer(config(dims=DIMS), MPI.COMM_SELF)
    prof = Profiler(clock).install(t.grid.communicators())
    losses = []
    try:
        for step in range(steps):
            with prof.step(floor=step == 0):
                losses.append(t.step(step).loss)
    finally:
        prof.remove()
    return prof, losses


def test_categories_add_up_to_the_step():
    prof, _ = profiled_steps(3)
    figures = prof.per_step()
    assert prof.steps == 2                                   # the first step measured the floor only
    parts = {k: v for k, v in figures.items() if k not in ("step", "gemm_floor")}
    assert {"GEMM", "attention", "elementwise", "embedding/loss", "optimizer", "data", "other"} <= set(parts)
    assert all(v >= 0 for k, v in parts.items() if k != "other")
    assert sum(parts.values()) == pytest.approx(figures["step"], rel=1e-12)
    # exclusive times nest inside the step: "other" is what no category claimed, never below zero
    # beyond the clock's resolution
    assert parts["other"] > -1e-6
    assert 0 < figures["gemm_floor"]
    # the GEMMs as they ran: inside the GEMM category and attention's (a wrapper's microseconds more)
    assert 0 < prof.gemm_seconds / prof.steps < parts["GEMM"] + parts["attention"] + 1e-3
    text = report([figures])
    assert "GEMM floor" in text and "its floor" in text and "elementwise" in text


def test_profiling_changes_no_number_and_removes_itself():
    original = (precision.gemm, layernorm.layernorm_forward, Trainer._contexts_and_batches)
    _, profiled = profiled_steps(3)
    assert (precision.gemm, layernorm.layernorm_forward, Trainer._contexts_and_batches) == original
    t = Trainer(config(dims=DIMS), MPI.COMM_SELF)
    plain = [t.step(step).loss for step in range(3)]
    # the same computation on the same machine: the floor step's repeated GEMMs write the same values again
    np.testing.assert_array_equal(profiled, plain)


def test_cpu_clock_for_a_busy_machine():
    prof, _ = profiled_steps(2, clock=time.process_time)
    assert prof.per_step()["step"] > 0


@pytest.mark.parametrize("layout, axis", [(["--pp", "2", "--microbatches", "2"], "comm pp"),
                                          (["--dp", "2"], "comm dp")])
def test_profile_at_two_ranks(layout, axis):
    proc, _ = run_mpi(2, hpcpar() + ["train", "--model", "tiny", "--layers", "2", "--hidden", "32", "--heads", "4",
                                     "--seq-len", "16", "--batch-size", "4", "--steps", "3", "--no-progress",
                                     "--profile", *layout], timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("profile: one step, mean over 2 ranks")[1].split("  GEMM floor")[0]
    rows = dict(re.match(r"\s+(\S.*?)\s+([\d.]+) ms", line).groups() for line in table.strip("\n").splitlines())
    assert axis in rows and "GEMM" in rows and "other" in rows
    # the printed rows (ms, rounded to 0.01) add up to the printed step
    total = sum(float(ms) for name, ms in rows.items() if name != "step")
    assert total == pytest.approx(float(rows["step"]), abs=0.01 * len(rows))
    assert "GEMM floor" in proc.stdout
