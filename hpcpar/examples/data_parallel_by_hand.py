"""Two replicas, half a batch each, gradients summed (docs/data_parallel.md).

    .venv/bin/mpiexec -n 2 .venv/bin/python -m hpcpar.examples.data_parallel_by_hand

Both ranks build the same `tiny` GPT from the same seed.  Step 0's global batch has 32 sequences;
rank r takes sample ids 16 r .. 16 r + 15, so together they see exactly the batch one rank would.
Each backward starts from dloss = 1 / (tokens in the *global* batch), so the *sum* of the two
ranks' gradients is the single-rank gradient: one all-reduce per parameter, no division afterwards.

Part 1 does that by hand, one all-reduce per parameter tensor.  Part 2 uses hpcpar's DataParallel:
the parameters live in a few flat buckets filled in backward order, and each bucket's non-blocking
all-reduce starts as soon as the backward has produced all of its gradients, while the backward of the
earlier layers goes on.
"""
import sys

import numpy as np

from hpcpar.examples._common import once, rank_by_rank, require_size

BATCH, SEED = 32, 0


def main():
    from mpi4py import MPI

    from hpcpar.comm import Communicator
    from hpcpar.data import MarkovLanguage
    from hpcpar.data_parallel.replicas import DataParallel
    from hpcpar.nn import GPT, Context
    from hpcpar.nn.gpt import preset

    world = MPI.COMM_WORLD
    require_size(world, 2, "data_parallel_by_hand")
    dp = Communicator(world, "dp")
    r = dp.rank
    data = MarkovLanguage(32, 2, 4, seq_len=64, seed=SEED)
    cfg = preset("tiny", vocab_size=32)
    tokens = BATCH * cfg.seq_len
    share = BATCH // dp.size
    mine = range(r * share, (r + 1) * share)          # this replica's sample ids of the global batch
    ids, targets = data.batch(0, mine)
    ctx = Context(step=0, sample_ids=list(mine), seed=SEED)

    # the single-rank reference: the whole batch on one rank
    whole = GPT(cfg, seed=SEED, dtype="float64")
    all_ids, all_targets = data.batch(0, range(BATCH))
    ref_loss, c = whole.forward(all_ids, Context(step=0, sample_ids=list(range(BATCH)), seed=SEED), all_targets)
    whole.backward(1.0 / tokens, c)
    ref = {p.name: p.grad for p in whole.parameters()}

    def worst(model):
        return max(float(np.linalg.norm(p.grad - ref[p.name]) / np.linalg.norm(ref[p.name]))
                   for p in model.parameters())

    # --- part 1: by hand ------------------------------------------------------------------------
    model = GPT(cfg, seed=SEED, dtype="float64")
    checksum = sum(float(p.data.sum()) for p in model.parameters())
    loss, caches = model.forward(ids, ctx, targets)
    model.backward(1.0 / tokens, caches)
    before = worst(model)
    for p in model.parameters():
        dp.all_reduce_(p.grad)                         # sum over the replicas, in place
    calls, kib = dp.stats.calls["all_reduce"], dp.stats.bytes["all_reduce"] // 1024
    total = dp.all_reduce(np.array([float(loss)]))[0] / tokens
    once(world, "part 1: one all-reduce per parameter tensor")
    rank_by_rank(world, [f"replica of {len(model.parameters())} tensors, checksum {checksum:.12f}; "
                         f"samples {mine.start}-{mine.stop - 1}; loss sum {float(loss):.6f}",
                         f"own gradient vs one rank: relative difference up to {before:.2f} (half a batch)",
                         f"after the all-reduces: {worst(model):.1e}   ({calls} all-reduces, {kib} KiB)"])
    once(world, f"loss {total:.12f} (one rank: {float(ref_loss) / tokens:.12f})")

    # --- part 2: buckets in backward order, all-reduces overlapping the backward ---------------------
    dp.stats.reset()
    model = GPT(cfg, seed=SEED, dtype="float64")
    events = []

    class Narrated(DataParallel):
        def grads_ready(self, params):      # the model calls this, through its door, as gradients become final
            launched = len(self.launch_times)
            super().grads_ready(params)
            events.append(f"{part(params)}: gradients final"
                          + "".join(f"; bucket {k} all-reduce started" for k in range(launched, len(self.launch_times))))
    ddp = Narrated(model.parameters(), dp, bucket_mb=0.2, groups=model.grad_groups())
    ddp.attach([model])                     # the model's door (nn/stage.py): its hooks are now ddp
    once(world, "")
    once(world, f"part 2: {len(ddp.flats)} buckets of about 0.2 MB, filled in backward order, cut where the "
                "backward reports")
    for i, b in enumerate(ddp.flats):
        once(world, f"  bucket {i}: {len(b.params):>2} tensors, {b.master.nbytes // 1024:>3} KiB, "
                    f"{b.params[0].name} ... {b.params[-1].name}")

    def part(params):
        """Which part of the model reported: a block, the head or the embedding."""
        name = params[0].name
        return "block " + ".".join(name.split(".")[:2]) if name.startswith("h.") else \
            ("the head" if name.startswith("ln_f") else "the embedding")

    loss, caches = model.forward(ids, ctx, targets)
    ddp.start_step()
    model.backward(1.0 / tokens, caches, final=True)
    events.append("backward finished; waiting for the all-reduces")
    ddp.finish()
    events.append(f"gradients vs one rank: max relative difference {worst(model):.1e}   "
                  f"({dp.stats.calls['all_reduce']} all-reduces, {dp.stats.bytes['all_reduce'] // 1024} KiB)")
    rank_by_rank(world, events)
    return 0


if __name__ == "__main__":
    from hpcpar.runtime import run_guarded
    sys.exit(run_guarded(main))
