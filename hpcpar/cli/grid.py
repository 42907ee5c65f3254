"""Show how the ranks of a job map onto tensor, context, pipeline and data parallel groups.

Under mpiexec every rank builds the grid (its communicators included) and rank 0 prints the map;
with --world N the map is computed without MPI, for any N (teaching and planning).

  mpiexec -n 8 hpcpar grid --tp 2 --pp 2 --dp 2
  hpcpar grid --tp 2 --cp 2 --pp 2 --dp 2 --world 16
  hpcpar grid --tp 4 --pp 4 --dp 8 --world 128
  hpcpar grid --tp 4 --pp 2 --dp 2 --world 16 --ranks-per-node 8   (+ nodes, and which link each group uses)
  hpcpar grid --ep 2 --dp 4 --world 4           (+ the expert groups: ep folded into dp x cp)
  hpcpar grid --dp 8 --dp-shard 4 --world 8     (+ HSDP's shard groups and the ranks across them)
"""
HELP = "print the rank map of a tp x cp x pp x dp grid"
MAX_WORLD = 4096        # ranks of the largest map drawn without MPI (seconds; 16,384 took 30 s)


def add_arguments(p):
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (ranks sharing each layer)")
    p.add_argument("--cp", type=int, default=1, help="context-parallel size (ranks sharing each sequence)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (stages)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel size (model replicas)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size: consecutive ranks of dp x cp that share "
                                                     "the experts (folded into dp x cp)")
    p.add_argument("--dp-shard", type=int, default=0, metavar="N",
                   help="HSDP: ZeRO's shard groups of N dp ranks (x cp), replicated across the groups")
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
        _sizes(layout, args.ep, args.dp_shard)                 # refused before anything is printed
        print(layout.describe())
        print()
        print(layout.picture())
        _folds(layout, args.ep, args.dp_shard)
        _nodes(layout, args.ranks_per_node)
        return 0
    from hpcpar.comm.grid import ParallelGrid
    grid = ParallelGrid(order=args.order, tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp)
    folds = _sizes(grid, args.ep, args.dp_shard)              # the same refusal on every rank
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
    if folds:                                   # the folds on real ranks agree with the pure arithmetic
        made = [grid.fold(grid.dp_cp_comm, size, names) for size, names in folds]
        seen = grid.world_comm.mpi.gather([[c.mpi.allgather(grid.rank_id) for c in pair] for pair in made], root=0)
        if grid.rank_id == 0:
            for rank, pairs in enumerate(seen):
                want = [list(map(list, grid.folded(rank, grid.group(rank, "dp", "cp"), size))) for size, _ in folds]
                assert pairs == want, f"rank {rank}: folded communicators disagree"
            _folds(grid, args.ep, args.dp_shard)
    if grid.rank_id == 0:
        _nodes(grid, args.ranks_per_node)
    return 0


def _sizes(layout, ep, dp_shard):
    """(size, (block name, complement name)) of each fold asked for, checked against the layout."""
    from hpcpar.runtime import UsageError
    n = layout.dp * layout.cp
    out = []
    if ep > 1:
        if n % ep:
            raise UsageError(f"--ep {ep} must divide dp x cp = {n}")
        out.append((ep, ("ep", "edp")))
    if dp_shard:
        if layout.dp % dp_shard:
            raise UsageError(f"--dp-shard {dp_shard} must divide dp = {layout.dp}")
        out.append((dp_shard * layout.cp, ("shard", "across")))
    return out


def _folds(layout, ep, dp_shard):
    """The groups each fold makes, each once: ep's and HSDP's."""
    words = {"ep": ("ep groups", "each MoE layer's experts spread over them, tokens sent by all-to-all"),
             "edp": ("expert-data groups", "the same experts: their gradients summed over them"),
             "shard": ("shard groups", "ZeRO's state cut over them: reduce-scatters and gathers"),
             "across": ("across groups", "the same range in each shard group: all-reduced over them")}
    for size, names in _sizes(layout, ep, dp_shard):
        what = f"ep {ep} folded into dp x cp" if names[0] == "ep" else \
            f"HSDP: dp-shard {dp_shard} x cp {layout.cp} = {size} ranks a shard group"
        print(f"\n{what} (comm/grid.py fold):")
        for i, name in enumerate(names):
            groups = {tuple(layout.folded(r, layout.group(r, "dp", "cp"), size)[i]): 0 for r in range(layout.world)}
            label, meaning = words[name]
            print(f"  {label:<19} " + "  ".join(",".join(map(str, g)) for g in groups))
            print(f"  {'':<19} ({meaning})")


def _nodes(layout, ranks_per_node):
    if ranks_per_node is not None:
        from hpcpar.comm.placement import describe
        print()
        print(describe(layout, ranks_per_node))
