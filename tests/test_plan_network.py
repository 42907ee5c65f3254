"""The alpha-beta communication model on the real rank order (hpcpar/tools/plan/network.py)."""
import pytest

from hpcpar.tools.plan.hardware import load_hardware
from hpcpar.tools.plan.layout import Layout
from hpcpar.tools.plan.network import all_reduce_seconds, group_link, members_per_node, reduce_scatter_seconds

A100 = load_hardware("a100")


def test_groups_follow_tp_then_cp_then_dp_then_pp():
    # rank = tp + TP*(cp + CP*(dp + DP*pp)): a TP group is consecutive, CP members TP apart, DP TP*CP
    assert members_per_node(Layout(8, 8, 16), "tp", 8) == (8, 8)
    assert members_per_node(Layout(8, 8, 16), "dp", 8) == (16, 1)
    assert members_per_node(Layout(2, 8, 64), "dp", 8) == (64, 4)
    assert members_per_node(Layout(2, 2, 2), "pp", 8) == (2, 2)
    assert members_per_node(Layout(2, 1, 4, cp=2), "cp", 8) == (2, 2)
    assert members_per_node(Layout(2, 1, 4, cp=2), "dp", 8) == (4, 2)
    assert members_per_node(Layout(8, 16, 4, cp=16), "cp", 8) == (16, 1)     # Llama 3: CP crosses nodes
    assert members_per_node(Layout(2, 1, 4, cp=2), "shard", 8) == (8, 4)


def test_grid_order_matches_hpcpar_grid():
    from hpcpar.comm.grid import GridLayout
    for tp, pp, dp in ((2, 2, 2), (2, 8, 64), (4, 2, 8), (1, 4, 16)):
        grid = GridLayout(tp * pp * dp, tp=tp, pp=pp, dp=dp)
        for axis in ("tp", "dp", "pp"):
            group = grid.group(0, axis)
            assert members_per_node(Layout(tp, pp, dp), axis, 8) == (len(group), sum(r < 8 for r in group))


def test_links_by_placement():
    assert group_link(A100, Layout(8, 8, 16), "tp", 8) == A100.intra
    one_port = group_link(A100, Layout(8, 8, 16), "dp", 8)
    assert one_port.bandwidth * one_port.efficiency == pytest.approx(A100.inter.bandwidth * A100.inter.efficiency)
    four_ports = group_link(A100, Layout(2, 8, 64), "dp", 8)
    assert four_ports.bandwidth == pytest.approx(4 * one_port.bandwidth)


def test_ring_formulas():
    link = A100.intra
    n, size = 1e9, 8
    beta = link.bandwidth * link.efficiency
    assert all_reduce_seconds(link, size, n) == pytest.approx(2 * 7 * link.latency + 2 * 7 / 8 * n / beta)
    assert reduce_scatter_seconds(link, size, n) * 2 == pytest.approx(all_reduce_seconds(link, size, n))
    assert all_reduce_seconds(link, 1, n) == 0.0


@pytest.mark.parametrize("name, bf16, memory_gib", [("a100", 312e12, 80), ("h100", 989e12, 80), ("h200", 989e12, 141)])
def test_vendor_profiles(name, bf16, memory_gib):
    hw = load_hardware(name)
    assert hw.peak("bf16") == bf16 and hw.memory_bytes == memory_gib * 2**30
    assert hw.intra.bandwidth > hw.inter.bandwidth and 0.5 < hw.calibration <= 1.0


def test_the_cp_ring_hop_that_leaves_the_node_uses_one_port():
    """Ring attention is one ring: with cp * tp > GPUs per node each step waits for a network hop."""
    from hpcpar.tools.plan.job import Job
    from hpcpar.tools.plan.models import load_model
    from hpcpar.tools.plan.network import cp_chunk_bytes, cp_ring_crosses_nodes, cp_ring_seconds
    model = load_model("llama3-8b")          # 8 key/value heads of 128
    inside = Job(model, A100, 8, 8, 8, 8192)
    assert not cp_ring_crosses_nodes(inside, Layout(2, 1, 1, cp=4))
    assert cp_chunk_bytes(inside, Layout(2, 1, 1, cp=4)) == 2 * 4 * 128 * 2048 * 2
    across = Job(model, A100, 16, 8, 8, 8192)
    lay = Layout(4, 1, 1, cp=4)
    assert cp_ring_crosses_nodes(across, lay)
    assert cp_ring_seconds(across, lay) == pytest.approx(3 * A100.inter.seconds(cp_chunk_bytes(across, lay)))


def test_the_planner_counts_the_hops_the_ring_engine_sends():
    """hpcpar's ring (context_parallel/ring.py) sends 3cp - 2 K/V-sized hops a layer: cp - 1 forward,
    cp - 1 of K and V and cp of dK, dV backward.  With no attention core to hide under, the planner's
    CP ring terms add up to that many hops; with a long core only the last dK, dV hop shows."""
    from hpcpar.tools.plan.compute import cp_times
    from hpcpar.tools.plan.job import Job
    from hpcpar.tools.plan.models import load_model
    from hpcpar.tools.plan.network import cp_ring_seconds
    job = Job(load_model("llama3-8b"), A100, 16, 8, 8, 8192)
    for cp in (2, 4):
        lay = Layout(16 // cp, 1, 1, cp=cp)
        hop = cp_ring_seconds(job, lay) / (cp - 1)
        assert sum(cp_times(job, lay, core=0.0).values()) == pytest.approx((3 * cp - 2) * hop)
        assert sum(cp_times(job, lay, core=1.0).values()) == pytest.approx(hop)


def test_an_all_gather_cp_engine_waits_for_its_gather():
    """Context parallelism that all-gathers K and V (engine.cp_allgather) pays one all-gather of the cp
    chunks forward and two collectives of the same size backward, exposed: the attention core hides
    none of it, unlike the ring's hops.  The gathered K and V are held whole (cp chunks)."""
    from dataclasses import replace
    from hpcpar.tools.plan.compute import layer_times
    from hpcpar.tools.plan.job import Engine, Job
    from hpcpar.tools.plan.memory import comm_buffer_bytes
    from hpcpar.tools.plan.models import load_model
    from hpcpar.tools.plan.network import cp_allgather_seconds, cp_chunk_bytes
    ring = Job(load_model("llama3-8b"), A100, 16, 8, 8, 8192, engine=Engine(flash_attention=True))
    gather = replace(ring, engine=Engine(flash_attention=True, cp_allgather=True))
    lay = Layout(4, 1, 1, cp=4)                      # cp members 4 apart: two on each node
    link = group_link(A100, lay, "cp", 8)
    seconds = cp_allgather_seconds(gather, lay)
    assert seconds == pytest.approx(reduce_scatter_seconds(link, 4, 4 * cp_chunk_bytes(gather, lay)))
    t = layer_times(gather, lay)
    assert t["fwd CP all-gather"] == seconds and t["bwd CP all-gather"] == 2 * seconds
    assert "fwd CP ring" not in t and layer_times(ring, lay)["fwd CP ring"] == 0.0   # the ring hides under the core
    extra = comm_buffer_bytes(gather, lay) - comm_buffer_bytes(ring, lay)
    assert extra == 2 * cp_chunk_bytes(ring, lay)
    from hpcpar.tools.plan.explain import explain
    from hpcpar.tools.plan.step import estimate
    assert "CP all-gather of 4 K and V chunks" in explain(estimate(gather, lay))


def test_ulysses_all_to_alls_are_the_bytes_the_engine_sends():
    """Ulysses (context_parallel/ulysses.py) hands its all-to-alls 4 b (s/cp) d (a + kv) / t bytes a layer
    and micro-batch; the planner's two forward messages, counted twice (the backward moves the same),
    are those bytes, and each costs (cp-1) alpha + (cp-1)/cp n / beta on the cp group's link, exposed."""
    from hpcpar.context_parallel.ulysses import ulysses_bytes
    from hpcpar.tools.plan.compute import cp_times
    from hpcpar.tools.plan.job import Job
    from hpcpar.tools.plan.models import load_model
    from hpcpar.tools.plan.network import all_to_all_seconds, cp_all_to_all_seconds, ulysses_message_bytes
    model = load_model("llama3-8b")                  # 32 heads, 8 key/value heads of 128
    job = Job(model, A100, 16, 8, 8, 8192)
    lay = Layout(2, 1, 2, cp=4, cp_kind="ulysses")
    qkv, o = ulysses_message_bytes(job, lay)
    assert 2 * (qkv + o) == ulysses_bytes(1, 8192, 4, 128, 32 // 2, 8 // 2, 2)
    link = group_link(A100, lay, "cp", 8)
    assert cp_all_to_all_seconds(job, lay) == pytest.approx(all_to_all_seconds(link, 4, qkv)
                                                            + all_to_all_seconds(link, 4, o))
    assert cp_times(job, lay, core=1.0) == {"fwd CP all-to-all": cp_all_to_all_seconds(job, lay),
                                            "bwd CP all-to-all": cp_all_to_all_seconds(job, lay)}


def test_ulysses_layouts_need_heads_divisible_by_cp_and_the_search_tries_both_kinds():
    from hpcpar.tools.plan.job import Job
    from hpcpar.tools.plan.layout import parse_layout
    from hpcpar.tools.plan.models import load_model
    from hpcpar.tools.plan.search import Space, candidates
    job = Job(load_model("llama3-8b"), A100, 16, 8, 16, 8192)
    lay = parse_layout("tp2-pp1-dp2-mb1-v1-1f1b-cp4-ulysses")
    assert lay.cp_kind == "ulysses" and str(lay) == "tp2-pp1-dp2-mb1-v1-1f1b-cp4-ulysses"
    assert job.check(lay) is None
    assert "ulysses needs cp=8 to divide the 16 heads and 4 key/value heads" in job.check(
        parse_layout("tp2-pp1-dp1-mb1-v1-1f1b-cp8-ulysses"))
    kinds = {c.cp_kind for c in candidates(job, Space(fixed=(("cp", 4), ("tp", 2), ("pp", 1))))}
    assert kinds == {"ring", "ulysses"}
    assert {c.cp_kind for c in candidates(job, Space(fixed=(("cp", 1),)))} == {"ring"}
