"""The planner's memory formula against hpcpar's own measured peak per rank (hpcpar/tools/plan/measured.py).

Nine layouts of the tiny and small presets - one rank (plain, full recomputation, micro-batches) and
two ranks (tensor, pipeline - 1F1B, and ZB-V, whose rank 0 holds both ends of the model - ZeRO-1 data
and sequence parallelism) - and three with experts (moe-tiny on one rank; moe-tiny and mixtral-tiny
with ZeRO-1 on two ranks of ep 2: the experts' rows, router, all-to-all buffers and the routed
experts' state, tools/plan/experts.py): the tracemalloc peak of real
Trainer steps and memory.py's state + activations + buffers + workspace for the same rank agree
within 10 % (the two expert layouts of two ranks within 15 %: EXPERT_RANKS says why).  Peaks are allocation sizes, not timings: the same on any machine and under any load.
"""
import pytest

from hpcpar.training.config import TrainConfig
from hpcpar.tools.plan.measured import measure_peak, predict_peak

TOLERANCE = 0.10
SERIAL = [dict(model="tiny", batch_size=8), dict(model="small", batch_size=4),
          dict(model="small", batch_size=4, recompute=True), dict(model="small", batch_size=8, microbatches=4),
          dict(model="moe-tiny", batch_size=8)]
TWO_RANKS = [dict(model="small", batch_size=4, tp=2), dict(model="small", batch_size=8, pp=2, microbatches=4),
             dict(model="small", batch_size=4, dp=2, zero1=True),
             dict(model="tiny", batch_size=8, tp=2, sequence_parallel=True),
             dict(model="small", batch_size=8, pp=2, microbatches=4, schedule="zb-v")]
# The planner gives every expert its share of the rows; a freshly initialised router does not (moe-tiny's
# first steps: 100 to 393 choices per expert against an even 256), so the rank whose experts get more
# holds more than the even share: measured 7.49 and 7.86 MB on ranks 0 and 1 of moe-tiny at ep 2, 7.13 and
# 7.57 MB of mixtral-tiny, against 6.74 and 6.59 MB predicted (mixtral-tiny's family is 7 % under on
# one rank without experts too).  Within 15 %, the imbalance named rather than fitted.
EXPERT_RANKS = [dict(model="moe-tiny", batch_size=8, dp=2, ep=2),
                dict(model="mixtral-tiny", batch_size=8, dp=2, ep=2, zero=1)]
IMBALANCED = 0.15


def _label(kw):
    return "-".join(f"{k}{v}" for k, v in kw.items())


def _check(comm, kw, tolerance=TOLERANCE):
    from hpcpar.training.step import Trainer
    cfg = TrainConfig(**kw, steps=2)
    measured = measure_peak(cfg, comm)
    trainer = Trainer(cfg, comm)
    terms = predict_peak(trainer.cfg, trainer.mcfg, trainer.grid.pp_rank)
    trainer.grid.free()
    predicted = sum(terms.values())
    detail = ", ".join(f"{k} {v / 1e6:.2f}" for k, v in terms.items())
    assert abs(predicted / measured - 1) <= tolerance, \
        f"rank {comm.rank}: predicted {predicted / 1e6:.2f} MB ({detail}), measured {measured / 1e6:.2f} MB"


@pytest.mark.parametrize("kw", SERIAL, ids=_label)
def test_one_rank_peak_matches_formula(kw):
    from mpi4py import MPI
    _check(MPI.COMM_SELF, kw)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kw", TWO_RANKS, ids=_label)
def test_two_rank_peak_matches_formula(comm, kw):
    if comm.size != 2:
        pytest.skip("layouts of exactly 2 ranks")
    _check(comm, kw)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kw", EXPERT_RANKS, ids=_label)
def test_two_rank_expert_parallel_peak(comm, kw):
    if comm.size != 2:
        pytest.skip("layouts of exactly 2 ranks")
    _check(comm, kw, IMBALANCED)
