"""The pure grid arithmetic (no MPI): rank maps, groups and refusals, for worlds 1, 2, 4, 8."""
import pytest

from hpcpar.comm.grid import Coord, GridLayout, factorisations
from hpcpar.runtime import UsageError
from mpitools import hpcpar, run


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_every_factorisation_partitions_the_world(world):
    for tp, pp, dp in factorisations(world):
        g = GridLayout(world, tp=tp, pp=pp, dp=dp)
        for axis, size in (("tp", tp), ("pp", pp), ("dp", dp)):
            groups = g.groups(axis)
            assert sorted(r for grp in groups for r in grp) == list(range(world))
            assert all(len(grp) == size for grp in groups)
        # tensor-fastest order: a TP group is `tp` consecutive ranks
        for grp in g.groups("tp"):
            assert list(grp) == list(range(grp[0], grp[0] + tp))
        for r in range(world):
            c = g.coord(r)
            assert g.rank(tp=c.tp, pp=c.pp, dp=c.dp) == r
            assert r == c.tp + tp * (c.dp + dp * c.pp)   # docs/design.md: the rank order


def test_factorisations_of_8():
    assert len(factorisations(8)) == 10
    assert (2, 2, 2) in factorisations(8) and (8, 1, 1) in factorisations(8)


def test_pipeline_neighbours_are_tp_times_dp_apart():
    g = GridLayout(24, tp=2, pp=4, dp=3)
    for r in range(24):
        prev, nxt = g.pipeline_neighbours(r)
        c = g.coord(r)
        assert (prev is None) == (c.pp == 0) and (nxt is None) == (c.pp == 3)
        if nxt is not None:
            assert nxt - r == 2 * 3


def test_other_orders():
    g = GridLayout(8, order="dp-tp-pp", tp=2, pp=2, dp=2)
    assert g.group(0, "dp") == [0, 1]
    assert g.group(0, "tp") == [0, 2]
    with pytest.raises(UsageError, match="name tp, pp and dp once"):
        GridLayout(8, order="tp-tp-pp", tp=2, pp=2, dp=2)


@pytest.mark.parametrize("sizes, world, msg", [
    ((4, 2, 1), 6, "4 x 2 x 1 = 8 does not match the world size 6"),
    ((0, 1, 1), 1, "tp must be a positive integer"),
    ((1, -2, 1), 1, "pp must be a positive integer"),
])
def test_bad_sizes_refused(sizes, world, msg):
    with pytest.raises(UsageError, match=msg):
        GridLayout(world, **dict(zip(("tp", "pp", "dp"), sizes)))


def test_describe_2x2x2_table():
    text = GridLayout(8, tp=2, pp=2, dp=2).describe()
    lines = text.splitlines()
    assert len(lines) == 3 + 8
    # rank 5 = tp 1, pp 1, dp 0; TP group 4,5; previous stage rank 1
    assert lines[3 + 5].split() == ["5", "1", "1", "0", "4,5", "1,5", "5,7", "1", "-"]


def test_grid_command_without_mpi():
    proc, _ = run(hpcpar() + ["grid", "--tp", "4", "--pp", "4", "--dp", "8", "--world", "128"])
    assert proc.returncode == 0, proc.stderr
    assert "128 ranks" in proc.stdout and len(proc.stdout.splitlines()) > 128
    proc, _ = run(hpcpar() + ["grid", "--tp", "3", "--world", "4"])
    assert proc.returncode == 2
    assert proc.stderr.strip() == "hpcpar: error: tp x pp x dp = 3 x 1 x 1 = 3 does not match the world size 4"


def test_a_fold_cuts_a_group_into_blocks_and_their_complement():
    """ep 2 folded into dp x cp = 4: the ep groups are consecutive ranks of it, the expert-data groups
    the ranks at the same place in each block; folding a complement again (HSDP over the experts)."""
    layout = GridLayout(16, tp=2, cp=2, dp=4)
    members = layout.group(5, "dp", "cp")                       # rank 5: tp 1, cp 0, dp 1
    assert members == [1, 3, 5, 7, 9, 11, 13, 15]
    assert layout.folded(5, members, 2) == ([5, 7], [1, 5, 9, 13])
    assert layout.folded(5, [1, 5, 9, 13], 2) == ([1, 5], [5, 13])
    with pytest.raises(UsageError, match="does not fold into blocks of 3"):
        layout.folded(5, members, 3)


def test_grid_prints_the_expert_and_hsdp_groups():
    proc, _ = run(hpcpar() + ["grid", "--ep", "2", "--dp", "4", "--world", "4"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[lines.index("ep 2 folded into dp x cp (comm/grid.py fold):") + 1].split() == ["ep", "groups", "0,1",
                                                                                                "2,3"]
    assert [line.split()[2:] for line in lines if line.startswith("  expert-data groups")] == [["0,2", "1,3"]]
    proc, _ = run(hpcpar() + ["grid", "--dp", "8", "--dp-shard", "4", "--world", "8"])
    assert [line.split()[2:] for line in proc.stdout.splitlines() if line.startswith("  shard groups")] == \
        [["0,1,2,3", "4,5,6,7"]]
    proc, _ = run(hpcpar() + ["grid", "--ep", "3", "--dp", "4", "--world", "4"])
    assert proc.returncode == 2 and proc.stderr.strip() == "hpcpar: error: --ep 3 must divide dp x cp = 4"
    assert not proc.stdout


def test_ranks_per_node_shows_which_link_each_group_crosses():
    """Two nodes of 8, tp 4 x pp 2 x dp 2: TP and DP inside a node, only the pipeline crosses (tp-dp-pp);
    the order pp-dp-tp sends every TP all-reduce over the network instead."""
    from hpcpar.comm.grid import GridLayout
    from hpcpar.comm.placement import describe, link
    text = describe(GridLayout(16, tp=4, pp=2, dp=2), 8)
    assert "node 1: ranks 8-15" in text
    assert "tp: all 4 groups intra-node (rank 0's: 0,1,2,3)" in text
    assert "pp: all 8 groups inter-node (rank 0's: 0,8)" in text
    assert "pipeline sends: 8 of 8 stage-to-stage hops cross nodes" in text
    assert "tp: all 4 groups inter-node" in describe(GridLayout(16, "pp-dp-tp", tp=4, pp=2, dp=2), 8)
    assert link([0, 1, 2, 3], 4) == "intra-node" and link([2, 3, 4, 5], 4) == "inter-node"
    mixed = describe(GridLayout(6, tp=2, pp=1, dp=3), 4)        # dp groups 0,2,4 and 1,3,5 straddle nodes 0-3 | 4-5
    assert "dp: all 2 groups inter-node" in mixed and "tp: 1 of 3 groups" not in mixed


@pytest.mark.parametrize("world", [2, 4, 8])
def test_context_parallel_axis_sits_between_tp_and_dp(world):
    """rank = tp_i + TP (cp_i + CP (dp_i + DP pp_i)); cp = 1 leaves every rank where the 3D grid has it."""
    for tp, pp, dp in factorisations(world):
        assert [GridLayout(world, tp=tp, pp=pp, dp=dp, cp=1).coord(r) for r in range(world)] == \
            [GridLayout(world, tp=tp, pp=pp, dp=dp).coord(r) for r in range(world)]
    for cp in (c for c in (2, 4, 8) if world % c == 0):
        for tp, pp, dp in factorisations(world // cp):
            g = GridLayout(world, tp=tp, pp=pp, dp=dp, cp=cp)
            for axis, size in (("tp", tp), ("cp", cp), ("pp", pp), ("dp", dp)):
                groups = g.groups(axis)
                assert sorted(r for grp in groups for r in grp) == list(range(world))
                assert all(len(grp) == size for grp in groups)
            for r in range(world):
                c = g.coord(r)
                assert r == c.tp + tp * (c.cp + cp * (c.dp + dp * c.pp)) == g.rank(tp=c.tp, pp=c.pp, dp=c.dp, cp=c.cp)
                assert str(c) == f"tp{c.tp}.cp{c.cp}.pp{c.pp}.dp{c.dp}"
    with pytest.raises(UsageError, match="tp x cp x pp x dp = 1 x 2 x 1 x 1 = 2 does not match the world size 4"):
        GridLayout(4, tp=1, pp=1, dp=1, cp=2)


def test_error_lines_name_cp_only_when_the_grid_has_it():
    assert Coord(tp=0, pp=1, dp=0).words() == "tp 0, pp 1, dp 0"
    assert Coord(tp=0, pp=1, dp=0, cp=1).words() == "tp 0, cp 1, pp 1, dp 0"
    assert Coord(tp=1, pp=0, dp=1, cp=0).as_dict() == {"tp": 1, "cp": 0, "pp": 0, "dp": 1}
    from hpcpar.watch.why import coords_of
    layout = {"tp": 2, "cp": 2, "pp": 1, "dp": 1, "world": 4, "order": "tp-dp-pp"}
    assert coords_of(3, {0: {"layout": layout}}) == "tp 1, cp 1, pp 0, dp 0"


def test_a_new_axis_is_one_word_in_axes(monkeypatch):
    """With "ep" added to AXES alone, sizes, orders, coordinates, groups and maps know it."""
    from hpcpar.comm import grid
    monkeypatch.setattr(grid, "AXES", grid.AXES + ("ep",))
    g = GridLayout(16, tp=2, pp=2, dp=2, ep=2)
    assert g.order == ("tp", "cp", "dp", "ep", "pp")             # left out: right after dp, before it in AXES
    for r in range(16):
        c = g.coord(r)
        assert r == c.tp + 2 * (c.dp + 2 * (c.ep + 2 * c.pp)) == g.rank(c)
    for axes in (("ep",), ("dp", "ep"), ("tp", "pp", "dp", "ep")):
        groups = g.groups(*axes)
        assert sorted(r for grp in groups for r in grp) == list(range(16))
    assert "ep group" in g.describe() and str(g.coord(15)) == "tp1.pp1.dp1.ep1"
    assert GridLayout(8, "ep-tp-dp-pp", tp=2, pp=2, ep=2).group(0, "tp") == [0, 2]


def test_coord_is_a_mapping():
    c = GridLayout(16, tp=2, pp=2, dp=2, cp=2).coord(13)
    assert dict(c) == {"tp": 1, "cp": 0, "pp": 1, "dp": 1} and c["cp"] == c.cp == 0 and list(c) == list(c.keys())
    assert Coord(tp=1, pp=0, dp=1) == {"tp": 1, "pp": 0, "dp": 1} and Coord(tp=1, pp=0, dp=1).cp is None
    with pytest.raises(TypeError, match="unknown axes"):
        Coord(tp=0, xp=1)
