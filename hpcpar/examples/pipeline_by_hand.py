"""Two pipeline stages and their messages, written out by hand (docs/pipeline.md, "The MPI engine").

    .venv/bin/mpiexec -n 2 .venv/bin/python -m hpcpar.examples.pipeline_by_hand

The `tiny` GPT (2 blocks) cut in two: rank 0 holds the embedding and block 0, rank 1 block 1, the
final LayerNorm, the head and the loss.  Step 0's batch of 32 sequences runs as 2 micro-batches of 16
in GPipe order: both forwards, then both backwards.  Each arrow between the ranks is one MPI message:
an activation (micro-batch, 64 positions, 64 features) forward, its gradient backward.

Blocking Send/Recv are safe in this order because every message of a phase goes the same way (rank 0
-> 1 in the forwards, 1 -> 0 in the backwards).  1F1B mixes the two directions and needs non-blocking
sends with receives posted ahead; hpcpar/pipeline/engine.py does that for every schedule.

The head's output projection is the token embedding (tied weights), so both ranks hold a copy of it;
after the backward the two copies' gradients are summed, which keeps the copies equal.  At the end
every rank compares its gradients with the whole model's on one rank.
"""
import sys

import numpy as np

from hpcpar.examples._common import once, rank_by_rank, require_size

BATCH, MICRO, SEED = 32, 16, 0


def main():
    from mpi4py import MPI

    from hpcpar.comm import Communicator
    from hpcpar.data import MarkovLanguage
    from hpcpar.nn import GPT, Context
    from hpcpar.nn.gpt import preset

    world = MPI.COMM_WORLD
    require_size(world, 2, "pipeline_by_hand")
    pp = Communicator(world, "pp")
    rank = pp.rank
    data = MarkovLanguage(32, 2, 4, seq_len=64, seed=SEED)
    cfg = preset("tiny", vocab_size=32)
    tokens = BATCH * cfg.seq_len
    dloss = 1.0 / tokens                         # the whole batch's mean, summed over micro-batches
    first, last = rank == 0, rank == 1
    stage = GPT(cfg, seed=SEED, dtype="float64", layers=[rank], first=first, last=last)
    log = [f"holds {'embedding, ' if first else ''}block h.{rank}{', ln_f, head and loss' if last else ''}: "
           f"{sum(p.data.size for p in stage.parameters()):,} parameters"]

    micro = [range(m * MICRO, (m + 1) * MICRO) for m in range(BATCH // MICRO)]
    act = (MICRO, cfg.seq_len, cfg.d_model)      # shape of every message, known ahead on both sides
    caches, losses = {}, []
    for m, samples in enumerate(micro):          # GPipe: all forwards ...
        ids, targets = data.batch(0, samples)
        ctx = Context(step=0, sample_ids=list(samples), seed=SEED)
        if first:
            h, caches[m] = stage.forward(ids, ctx)
            pp.send(h, dest=1, tag=m)
            log.append(f"F{m}: forward of samples {samples.start}-{samples.stop - 1}, send activation "
                       f"{h.shape} ({h.nbytes // 1024} KiB) to rank 1")
        else:
            h = pp.recv_(np.empty(act), source=0, tag=m)
            loss, caches[m] = stage.forward(h, ctx, targets)
            losses.append(float(loss))
            log.append(f"F{m}: receive activation {h.shape} from rank 0, forward, loss sum {float(loss):.6f}")
    for m in range(len(micro)):                  # ... then all backwards
        if last:
            dh = stage.backward(dloss, caches.pop(m))
            pp.send(dh, dest=0, tag=100 + m)
            log.append(f"B{m}: backward from dloss = 1/{tokens}, send gradient {dh.shape} to rank 0")
        else:
            dh = pp.recv_(np.empty(act), source=1, tag=100 + m)
            stage.backward(dh, caches.pop(m))
            log.append(f"B{m}: receive gradient {dh.shape} from rank 1, backward to the embedding")

    wte = stage.embed.wte if first else stage.head.weight
    own = float(np.linalg.norm(wte.grad))
    pp.all_reduce_(wte.grad)                     # tied embedding: sum the two copies' gradients
    log.append(f"tied embedding: own gradient norm {own:.6f}, after summing both copies "
               f"{float(np.linalg.norm(wte.grad)):.6f}")
    sent = pp.stats.bytes["send"]
    log.append(f"sent {pp.stats.calls['send']} messages, {sent // 1024} KiB")
    rank_by_rank(world, log)

    loss = pp.all_reduce(np.array([sum(losses)], dtype=np.float64))[0] / tokens   # same dtype on both ranks
    once(world, f"pipeline loss {loss:.12f}")

    # the same step on one rank, to compare with
    whole = GPT(cfg, seed=SEED, dtype="float64")
    ids, targets = data.batch(0, range(BATCH))
    ref_loss, c = whole.forward(ids, Context(step=0, sample_ids=list(range(BATCH)), seed=SEED), targets)
    whole.backward(dloss, c)
    ref = {p.name: p.grad for p in whole.parameters()}
    worst = max(float(np.linalg.norm(p.grad - ref[p.name]) / np.linalg.norm(ref[p.name]))
                for p in stage.parameters())
    once(world, f"one rank: loss {float(ref_loss) / tokens:.12f}")
    rank_by_rank(world, [f"gradients vs one rank: max relative difference {worst:.1e}"])
    return 0


if __name__ == "__main__":
    from hpcpar.runtime import run_guarded
    sys.exit(run_guarded(main))
