"""FLOP counts (hpcpar/tools/plan/flops.py): the GEMM list adds up to Narayanan et al.'s closed forms."""
import pytest

from hpcpar.tools.plan.flops import layer_gemms, logits_gemm, narayanan_flops, step_flops
from hpcpar.tools.plan.models import load_model, parse_dims


@pytest.mark.parametrize("spec, batch, seq", [("gpt3-175b", 1536, 2048), ("l=24,h=2304,a=24,V=51200", 512, 2048),
                                               ("l=3,h=64,a=4,V=100", 7, 33)])
def test_gemms_add_up_to_the_closed_forms(spec, batch, seq):
    m = load_model(spec)
    assert step_flops(m, batch, seq) == pytest.approx(narayanan_flops(batch, seq, m.layers, m.hidden, m.vocab))
    assert step_flops(m, batch, seq, "full") == pytest.approx(
        narayanan_flops(batch, seq, m.layers, m.hidden, m.vocab, recompute=True))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tensor_parallel_splits_every_gemm(tp):
    m = parse_dims("l=2,h=512,a=8,V=1024")
    whole = sum(g.flops for g in layer_gemms(m, 2, 64, 1)) + logits_gemm(m, 2, 64, 1).flops
    part = sum(g.flops for g in layer_gemms(m, 2, 64, tp)) + logits_gemm(m, 2, 64, tp).flops
    assert part * tp == whole


def test_experts_are_whole_on_a_tp_rank_which_routes_its_share_of_the_tokens():
    """The MoE layer is not cut over TP: a rank runs the router and whole experts on its 1/tp of the
    tokens (sequence parallelism), so the FLOPs split by tp as the dense GEMMs' do, but not the widths."""
    m = load_model("mixtral-8x7b")
    one, two = ({g.name: g for g in layer_gemms(m, 2, 64, tp)} for tp in (1, 2))
    for name in ("router", "moe up", "moe down"):
        assert two[name].flops * 2 == one[name].flops
        assert two[name].n == one[name].n                   # whole experts: the width is not cut
    assert two["router"].m == 64                            # 2 x 64 tokens, half of them on each rank


def test_selective_recompute_adds_only_the_attention_core():
    m = load_model("gpt3-175b")
    extra = step_flops(m, 8, 2048, "selective") - step_flops(m, 8, 2048)
    assert extra == m.layers * 2 * (2 * 8 * 2048 * 2048 * m.hidden)   # QK^T and PV forward again
