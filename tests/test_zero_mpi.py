"""ZeRO-2 and ZeRO-3 on real ranks, float64: the loss, every gradient and every weight after one AdamW
step equal the single rank's within 1e-10, composed with TP (and SP), CP, PP and its schedules, both
ways of --reshard-after-forward."""
import pytest

from train_helpers import free, global_loss, reference, rel_err, trainer

# (name, layout without dp: dp fills the world)
CASES = [
    ("dp.z3", dict(zero=3)),
    ("tp2.sp.z3", dict(tp=2, sequence_parallel=True, zero=3)),
    ("tp2.pp2.z3.1f1b", dict(tp=2, pp=2, zero=3, microbatches=4)),
    ("tp2.pp2.z3.interleaved", dict(tp=2, pp=2, zero=3, schedule="interleaved", chunks=2, microbatches=4)),
    ("cp2.z3", dict(cp=2, zero=3)),
    ("pp2.z2.zb-h1", dict(pp=2, zero=2, schedule="zb-h1", microbatches=4)),
]


def tensors(t, what):
    """{name: full tensor} of this layout: gathered over DP x CP (ZeRO), then assembled over TP."""
    local = {k: v.copy() for k, v in t.dp.gathered(what).items()}
    out = {}
    for p in t.parameters():
        mine = local[p.name]
        out[p.name] = mine if p.shard is None else p.shard.assemble(t.grid.tp_comm.mpi.allgather(mine),
                                                                       p.full_shape)
    return out


def one_step(t):
    """(loss, gradients, grad norm, weights after the step) of step 0."""
    losses = t.gradients(0)
    grads = tensors(t, "grad")
    result = t.update(0, losses)
    return result.loss, grads, result.grad_norm, tensors(t, "data")


def check_exact(comm, **kw):
    ref = reference(comm, **kw)
    want = one_step(ref)
    free(ref)
    t = trainer(comm, **kw)
    got = one_step(t)
    free(t)
    what = ", ".join(f"{k}={v}" for k, v in kw.items())
    assert rel_err(got[0], want[0]) <= 1e-10, f"loss differs ({what})"
    assert rel_err(got[2], want[2]) <= 1e-10, f"gradient norm differs ({what})"
    for kind, i in (("gradient", 1), ("weight", 3)):
        for name, value in got[i].items():
            err = rel_err(value, want[i][name])
            assert err <= 1e-10, f"{kind} of {name} differs by {err:.1e} ({what})"


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("reshard", [True, False], ids=["reshard", "keep"])
@pytest.mark.parametrize("name, layout", CASES, ids=[c[0] for c in CASES])
def test_zero_matches_one_rank(comm, name, layout, reshard):
    if comm.size not in (4, 8):
        pytest.skip("layouts of 4 or 8 ranks")
    if layout["zero"] != 3 and not reshard:
        pytest.skip("--reshard-after-forward is ZeRO-3's")
    model = layout.get("tp", 1) * layout.get("pp", 1) * layout.get("cp", 1)
    if comm.size // model < 2:                  # 4 ranks: the same layout without TP
        layout = {k: v for k, v in layout.items() if k not in ("tp", "sequence_parallel")}
        model //= 2
    extra = {} if reshard else dict(reshard_after_forward=False)
    check_exact(comm, dp=comm.size // model, **layout, **extra)
