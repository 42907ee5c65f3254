"""The project's main job: 3D-parallel training of a GPT on 8 ranks, tp 2 x pp 2 x dp 2.

  mpiexec -n 8 hpcpar demo          (or: make demo)

1. builds the 2 x 2 x 2 grid and prints the rank map;
2. checks every communication wrapper on every communicator against numpy (the self-check);
3. trains the `small` GPT on the synthetic Markov language (no download) with the 1F1B schedule and 8
   micro-batches, and prints the summary: loss against the entropy floor, tokens/s, MFU against the
   measured GEMM rate, measured against simulated bubble, bytes moved by each kind of group.
"""
HELP = "the 8-rank demonstration job: rank map, self-check, 2x2x2 training"


def add_arguments(p):
    p.add_argument("--steps", type=int, default=150, help="training steps (default 150; 0 skips training)")
    p.add_argument("--model", default="small", choices=["tiny", "small"], help="model preset (default small)")


def run(args):
    from hpcpar import rank_guard
    from hpcpar.config import TrainConfig
    from hpcpar.watchdog import flight_dir
    rank_guard.split(flight_dir(TrainConfig()))      # a parent that names this rank if it dies
    from hpcpar import selfcheck
    from hpcpar.grid import ParallelGrid
    from hpcpar.loop import Loop
    grid = ParallelGrid(tp=2, pp=2, dp=2)
    fails, volume = selfcheck.run(grid)
    all_fails = grid.world_comm.mpi.gather(fails, root=0)
    flat = [f for per_rank in all_fails or [] for f in per_rank]
    if grid.rank_id == 0:
        print(grid.describe(), "\n", grid.picture(), "\n", sep="")
        print("self-check: " + ("OK" if not flat else f"{len(flat)} FAILURES"),
              f"- every wrapper on {len(volume)} communicators, float32 and float64", flush=True)
        for f in flat:
            print("  ", f)
    failed = grid.world_comm.mpi.bcast(bool(flat), root=0)
    grid.free()
    if failed:
        return 1
    if args.steps == 0:
        return 0
    cfg = TrainConfig(tp=2, pp=2, dp=2, schedule="1f1b", microbatches=8, model=args.model, data="synthetic",
                      steps=args.steps, log_every=max(1, args.steps // 5))
    return Loop(cfg).run()
