"""Show how the ranks of a job map onto tensor, context, pipeline and data parallel groups.

Under mpiexec every rank builds the grid (its communicators included) and rank 0 prints the map;
with --world N the map is computed without MPI, for any N (teaching and planning).

  mpiexec -n 8 hpcpar grid --tp 2 --pp 2 --dp 2
  hpcpar grid --tp 2 --cp 2 --pp 2 --dp 2 --world 16
  hpcpar grid --tp 4 --pp 4 --dp 8 --world 128
  hpcpar grid --tp 4 --pp 2 --dp 2 --world 16 --ranks-per-node 8   (+ nodes, and which link each group uses)
"""
HELP = "print the rank map of a tp x cp x pp x dp grid"
MAX_WORLD = 4096        # ranks of the largest map drawn without MPI (seconds; 16,384 took 30 s)


def add_arguments(p):
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (ranks sharing each layer)")
    p.add_argument("--cp", type=int, default=1, help="context-parallel size (ranks sharing each sequence)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (stages)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel size (model replicas)")
    p.add_argument("--order", default="tp-dp-pp",
                   help="rank order, fastest-varying axis first (default tp-dp-pp, Megatron's)")
    p.add_argument("--world", type=int, default=None,
                   help="print the map for N ranks without starting MPI")
    p.add_argument("--ranks-per-node", type=int, default=None, metavar="N",
                   help="also place the ranks on nodes of N (consecutive ranks together) and say which "
                        "link, intra-node or inter-node, each group crosses")


def run(args):
    from hpcpar.comm.grid import GridLayout
    if args.world is not None:
        if args.world > MAX_WORLD:
            from hpcpar.runtime import UsageError
            raise UsageError(f"--world {args.world:,}: hpcpar grid draws maps of at most {MAX_WORLD:,} ranks")
        layout = GridLayout(args.world, args.order, tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp)
        print(layout.describe())
        print()
        print(layout.picture())
        _nodes(layout, args.ranks_per_node)
        return 0
    from hpcpar.comm.grid import ParallelGrid
    grid = ParallelGrid(order=args.order, tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp)
    # every rank reports what it sees; rank 0 checks it against the pure layout and prints the map
    mine = (grid.rank_id, grid.tp_comm.rank, grid.cp_comm.rank, grid.pp_comm.rank, grid.dp_comm.rank)
    seen = grid.world_comm.mpi.gather(mine, root=0)   # tiny, once: pickled gather is fine here
    if grid.rank_id == 0:
        for rank, tp_r, cp_r, pp_r, dp_r in seen:
            c = grid.coord(rank)
            assert (tp_r, cp_r, pp_r, dp_r) == (c.tp, c.cp or 0, c.pp, c.dp), f"rank {rank}: communicators disagree"
        print(grid.describe())
        print()
        print(grid.picture())
        _nodes(grid, args.ranks_per_node)
    return 0


def _nodes(layout, ranks_per_node):
    if ranks_per_node is not None:
        from hpcpar.comm.placement import describe
        print()
        print(describe(layout, ranks_per_node))
