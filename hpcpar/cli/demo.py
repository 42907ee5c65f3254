"""The project's main job and its proof, on 8 ranks, with no download:

  mpiexec -n 8 hpcpar demo          (or: make demo)

1. builds the tp 2 x pp 2 x dp 2 grid and prints the rank map;
2. checks every communication wrapper on every communicator against numpy (the self-check);
3. exactness, the project's central claim: a few steps of the tiny GPT in float64 on tp 2 x pp 2 x dp 2
   and on one rank - the losses of both, and their relative difference (round-off, about 1e-15);
4. trains the tiny GPT on the synthetic Markov language on all 8 ranks (TRAIN_LAYOUT) to within 10% of
   the language's entropy floor, the best loss any model can reach, and prints the run's summary and
   whether the loss got there (--steps and --model change the run; the defaults get there);
5. draws the loss curve against the floor as a PNG and prints its path;
6. samples a few lines from the trained model and counts the transitions the language allows.
"""
HELP = "the 8-rank demonstration job: rank map, self-check, exactness, training to the entropy floor"

EXACT_STEPS = 3
EXACT = dict(model="tiny", dtype="float64", batch_size=8, steps=EXACT_STEPS, warmup=0, progress=False)
# the 8-rank training: data parallelism over 4 replicas of a 2-stage pipeline, the layout with the fewest
# messages per step on 8 ranks sharing 2 cores (tp 2 x pp 2 x dp 2 is the exactness check's)
TRAIN_LAYOUT = dict(pp=2, dp=4, microbatches=2)
TARGET = 0.10              # within 10% of the entropy floor
SAMPLES, SAMPLE_TOKENS = 4, 30


def add_arguments(p):
    p.add_argument("--steps", type=int, default=1000, help="training steps (default 1000; 0 skips training)")
    p.add_argument("--model", default="tiny", choices=["tiny", "small"], help="model preset (default tiny)")
    p.add_argument("--out", default="runs/demo", help="directory of the metrics, the loss curve and the "
                                                      "trained weights (default runs/demo)")


def run(args):
    from hpcpar.watch import rank_guard
    from hpcpar.training.config import TrainConfig
    from hpcpar.watch.watchdog import flight_dir
    rank_guard.split(flight_dir(TrainConfig()))      # a parent that names this rank if it dies
    from mpi4py import MPI
    if MPI.COMM_WORLD.size != 8:
        from hpcpar.runtime import UsageError
        raise UsageError(f"hpcpar demo runs on 8 ranks (mpiexec -n 8), not {MPI.COMM_WORLD.size}")
    if not self_check():
        return 1
    if not exactness():
        return 1
    if args.steps == 0:
        return 0
    return train(args)


def say(*lines):
    from mpi4py import MPI
    if MPI.COMM_WORLD.rank == 0:
        print(*lines, sep="\n", flush=True)


def self_check():
    """The rank map and every wrapper against numpy; True when every rank passed."""
    from hpcpar.training import selfcheck
    from hpcpar.comm.grid import ParallelGrid
    grid = ParallelGrid(tp=2, pp=2, dp=2)
    fails, volume = selfcheck.run(grid)
    all_fails = grid.world_comm.mpi.gather(fails, root=0)
    flat = [f for per_rank in all_fails or [] for f in per_rank]
    say(grid.describe(), grid.picture(), "")
    say("self-check: " + ("OK" if not flat else f"{len(flat)} FAILURES")
        + f" - every wrapper on {len(volume)} communicators, float32 and float64", *("   " + f for f in flat))
    failed = grid.world_comm.mpi.bcast(bool(flat), root=0)
    grid.free()
    return not failed


def exactness():
    """The same steps on tp 2 x pp 2 x dp 2 and on one rank (rank 0), float64: both losses printed;
    True on every rank when they agree to 1e-10."""
    from mpi4py import MPI
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    world = MPI.COMM_WORLD
    eight = Trainer(TrainConfig(tp=2, pp=2, dp=2, microbatches=2, **EXACT), world)
    losses8 = [eight.step(s)[0] for s in range(EXACT_STEPS)]
    eight.grid.free()
    worst = None
    if world.rank == 0:
        one = Trainer(TrainConfig(**EXACT), MPI.COMM_SELF)
        losses1 = [one.step(s)[0] for s in range(EXACT_STEPS)]
        one.grid.free()
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses8, losses1))
        say(f"\nexactness, float64, the tiny GPT, {EXACT_STEPS} steps of {EXACT['batch_size']} sequences:",
            "  tp 2 x pp 2 x dp 2  " + "  ".join(f"{x:.15f}" for x in losses8),
            "  one rank            " + "  ".join(f"{x:.15f}" for x in losses1),
            f"  largest relative difference {worst:.1e} (float64 round-off: the 8 ranks sum in another order)"
            + ("" if worst < 1e-10 else "  FAILED: more than 1e-10"), "")
    return world.bcast(worst, root=0) < 1e-10


def train(args):
    """Training on 8 ranks to the floor, then the loss curve and samples (rank 0)."""
    from pathlib import Path
    from mpi4py import MPI
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.loop import Loop
    out = Path(args.out)
    cfg = TrainConfig(model=args.model, data="synthetic", steps=args.steps, log_every=max(1, args.steps // 5),
                      metrics=str(out / "metrics.jsonl"), export=str(out / "model.safetensors"), **TRAIN_LAYOUT)
    say(f"training the {args.model} GPT on the synthetic language, pp {TRAIN_LAYOUT['pp']} x dp "
        f"{TRAIN_LAYOUT['dp']} on 8 ranks, {args.steps} steps:")
    loop = Loop(cfg)
    status = loop.run()
    if MPI.COMM_WORLD.rank != 0 or status:
        return status
    loss, floor = loop.figures["loss"], loop.figures["entropy_floor"]
    above = loss / floor - 1
    print(f"\nfinal loss {loss:.4f}, entropy floor {floor:.4f}: {100 * above:+.1f}% "
          + (f"(within {100 * TARGET:.0f}%: the model has learned the language)" if above <= TARGET else
             f"(NOT within {100 * TARGET:.0f}%)"))
    print(f"loss curve: {plot(out, floor)}")
    sample(out, loop.trainer.data)
    return 0


def plot(out, floor):
    """The loss of every step against the entropy floor, as out/loss.png; returns its path."""
    import json
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] + 1 for r in records], [r["loss"] for r in records], label="training loss (8 ranks)")
    ax.axhline(floor, color="k", linestyle="--", label=f"entropy floor {floor:.3f}")
    ax.axhline(floor * (1 + TARGET), color="g", linestyle=":", label=f"floor + {100 * TARGET:.0f}%")
    ax.set(xlabel="step", ylabel="cross-entropy (nats per token)", yscale="log",
           title="hpcpar demo: the tiny GPT on the synthetic Markov language")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=100)
    plt.close(fig)
    return out / "loss.png"


def sample(out, language):
    """A few lines sampled from the exported model, each started from the language's own first tokens;
    how many of their transitions the language allows (each context has `branching` successors)."""
    import numpy as np
    from hpcpar.training.generate import generate, load_model
    model, _ = load_model(out / "model.safetensors", "float64")
    k, V, allowed, total = language.order, language.vocab_size, 0, 0
    print(f"sampled from the trained model (temperature 1; the first {k} tokens are the prompt):")
    for i in range(SAMPLES):
        prompt = [int(x) for x in language.batch(10**6 + i, [0])[0][0, :k]]   # a window no step trained on
        ids = generate(model, prompt, SAMPLE_TOKENS, temperature=1.0, seed=i)
        print("  " + " ".join(f"{x:2d}" for x in ids))
        for j in range(k, len(ids)):
            context = np.ravel_multi_index(ids[j - k:j], (V,) * k)          # the last k tokens, as one number
            allowed += int(ids[j] in language.succ[context])
            total += 1
    print(f"{allowed} of {total} sampled transitions are ones the language allows "
          f"({language.succ.shape[1]} of its {language.vocab_size} tokens may follow each context)")
