"""The project's main job: build the 2 x 2 x 2 grid on 8 ranks and check it end to end.

  mpiexec -n 8 hpcpar demo

Prints the rank map and the result of the communication self-check (every wrapper on every
communicator against numpy).
"""
HELP = "the 8-rank demonstration job (grid and communication self-check)"


def add_arguments(p):
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)


def run(args):
    from hpcpar import selfcheck
    from hpcpar.grid import ParallelGrid
    grid = ParallelGrid(args.tp, args.pp, args.dp)
    fails, volume = selfcheck.run(grid)
    all_fails = grid.world_comm.mpi.gather(fails, root=0)
    if grid.rank_id == 0:
        print(grid.describe(), "\n", grid.picture(), "\n", sep="")
        flat = [f for per_rank in all_fails for f in per_rank]
        print("self-check: " + ("OK" if not flat else f"{len(flat)} FAILURES"),
              f"- every wrapper on {len(volume)} communicators, float32 and float64;",
              "rank 0 payload bytes: " + ", ".join(f"{k} {v}" for k, v in volume.items()))
        for f in flat:
            print("  ", f)
        return 1 if flat else 0
    return 0
