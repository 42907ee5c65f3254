"""ParallelGrid on real ranks: communicators agree with the pure layout for every factorisation."""
import numpy as np
import pytest

from hpcpar.comm.grid import GridLayout, ParallelGrid, factorisations


@pytest.mark.mpi(min_size=1)
def test_every_factorisation_builds_matching_communicators(comm):
    for tp, pp, dp in factorisations(comm.size):
        grid = ParallelGrid(comm, tp=tp, pp=pp, dp=dp)
        layout = GridLayout(comm.size, tp=tp, pp=pp, dp=dp)
        c = layout.coord(comm.rank)
        assert grid.coords == c
        for axis in ("tp", "pp", "dp"):
            sub = getattr(grid, f"{axis}_comm")
            # the members of my sub-communicator, in its rank order, are the layout's group
            members = sub.mpi.allgather(comm.rank)
            assert members == layout.group(comm.rank, axis)
            assert sub.rank == getattr(c, axis)
        assert grid.mp_comm.size == tp * pp
        mp_members = grid.mp_comm.mpi.allgather(comm.rank)
        assert all(layout.coord(r).dp == c.dp for r in mp_members)
        embed = grid.comm_among("pp", (0, pp - 1), "embed") if pp > 1 else None
        assert (embed is not None) == (pp > 1 and c.pp in (0, pp - 1))
        if embed is not None:
            firstlast = embed.mpi.allgather(comm.rank)
            assert firstlast == [layout.rank(c, pp=0), layout.rank(c, pp=pp - 1)]
        # pipeline neighbours are really reachable: pass my rank down the pipeline
        if grid.next_rank is not None:
            grid.pp_comm.send(np.array([comm.rank]), dest=grid.pp_rank + 1, tag=3)
        if grid.prev_rank is not None:
            got = grid.pp_comm.recv_(np.empty(1, dtype=int), source=grid.pp_rank - 1, tag=3)
            assert got[0] == grid.prev_rank
        grid.free()


@pytest.mark.mpi(min_size=2)
def test_context_parallel_groups_match_the_layout(comm):
    """The cp ring and the dp x cp group (every rank with the same parameters) on real ranks."""
    for cp in (c for c in (2, 4, 8) if comm.size % c == 0):
        for tp, pp, dp in factorisations(comm.size // cp):
            grid = ParallelGrid(comm, tp=tp, pp=pp, dp=dp, cp=cp)
            layout = GridLayout(comm.size, tp=tp, pp=pp, dp=dp, cp=cp)
            assert grid.cp_comm.mpi.allgather(comm.rank) == layout.group(comm.rank, "cp")
            assert grid.cp_comm.rank == grid.cp_rank == layout.coord(comm.rank).cp
            same = sorted(grid.dp_cp_comm.mpi.allgather(comm.rank))
            assert same == sorted(r for q in layout.group(comm.rank, "dp") for r in layout.group(q, "cp"))
            grid.free()


@pytest.mark.mpi(min_size=2)
def test_a_communicator_over_any_set_of_axes(comm):
    """comm_over(*axes): the layout's group along those axes, the first axis slowest; axes of size 1
    add nobody (dp x cp is the dp group itself when cp = 1)."""
    from itertools import combinations
    cp = 2
    for tp, pp, dp in factorisations(comm.size // cp):
        grid = ParallelGrid(comm, tp=tp, pp=pp, dp=dp, cp=cp)
        layout = GridLayout(comm.size, tp=tp, pp=pp, dp=dp, cp=cp)
        for n in (1, 2, 3):
            for axes in combinations(("dp", "pp", "cp", "tp"), n):
                wide = [a for a in axes if layout.size(a) > 1] or list(axes)
                assert grid.comm_over(*axes).mpi.allgather(comm.rank) == layout.group(comm.rank, *wide)
        grid.free()
    grid = ParallelGrid(comm, dp=comm.size)
    assert grid.comm_over("dp", "cp") is grid.dp_comm is grid.dp_cp_comm
    grid.free()


@pytest.mark.mpi(min_size=4)
def test_folds_match_the_layout_and_are_made_once(comm):
    """ParallelGrid.fold: the ep group and its complement, and a fold of that complement, are the pure
    layout's groups on real ranks; folding again returns the same communicators, counted among the grid's."""
    grid = ParallelGrid(comm, tp=2, dp=comm.size // 2)
    layout = GridLayout(comm.size, tp=2, dp=comm.size // 2)
    ep, edp = grid.fold(grid.dp_cp_comm, 2, ("ep", "edp"))
    block, rest = layout.folded(comm.rank, layout.group(comm.rank, "dp"), 2)
    assert ep.mpi.allgather(comm.rank) == block and edp.mpi.allgather(comm.rank) == rest
    inner, across = grid.fold(edp, 1, ("edp_shard", "edp_across"))
    assert inner.size == 1 and across.mpi.allgather(comm.rank) == rest
    assert grid.fold(grid.dp_cp_comm, 2, ("ep", "edp")) == (ep, edp)
    assert {"ep", "edp", "edp_shard", "edp_across"} <= {c.name for c in grid.communicators()}
    grid.free()
