"""fp16 and bf16 in every kind of layout on 8 ranks: the losses of one rank in the same precision.

Not bit for bit: a layout changes where the fp32 sums of a GEMM are cut and rounded (a row-parallel
GEMM rounds each rank's partial product to the low precision before the fp32 sum), so activations
differ by units in the last place of the low precision.  The losses, computed in fp32 from them,
differ far less: measured at most 0.03 of the dtype's epsilon (fp16 ~1e-3, bf16 ~8e-3) over three
steps; the bound is a quarter of an epsilon - well below a rounding step, well above the measurement."""
import numpy as np
import pytest

from train_helpers import free, reference, rel_err, trainer

LAYOUTS = {
    "tp2.pp2.dp2.zero1": dict(tp=2, pp=2, dp=2, microbatches=2, zero1=True),
    "tp2.sp.pp2.dp2": dict(tp=2, pp=2, dp=2, microbatches=2, sequence_parallel=True),
    "pp4.interleaved.dp2": dict(pp=4, dp=2, schedule="interleaved", microbatches=4, chunks=2),
    "tp4.dp2": dict(tp=4, dp=2),
}
EPS = {"fp16": float(np.finfo(np.float16).eps), "bf16": 2.0 ** -7}


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_in_low_precision_match_one_rank(comm, precision, layout):
    sub = comm.Split(comm.rank // 8, comm.rank)
    kw = dict(LAYOUTS[layout], dtype="float32", precision=precision)
    t = trainer(sub, **kw)
    got = [t.step(s).loss for s in range(3)]
    free(t)
    sub.Free()
    ref = reference(comm, **kw)
    want = [ref.step(s).loss for s in range(3)]
    assert rel_err(got, want) <= 0.25 * EPS[precision], (got, want)
