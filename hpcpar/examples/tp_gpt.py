"""The `tiny` GPT on two tensor-parallel ranks, with and without sequence parallelism
(docs/tensor_parallel.md).

    .venv/bin/mpiexec -n 2 .venv/bin/python -m hpcpar.examples.tp_gpt

One forward and backward of step 0's batch (32 sequences of 64 tokens, float64) through the tensor-
parallel model that `hpcpar train --tp 2` builds.  For each variant it prints the loss (equal to one
rank's), every collective the TP group made in the forward and in the backward, and the bytes of
activations each rank keeps for the backward - in the blocks, and in total.
"""
import sys


from hpcpar.examples._common import once, require_size

BATCH, SEED = 32, 0


def collectives(stats, before):
    """'2 all_reduce (2.0 MiB)' for every op counted since ``before``."""
    out = []
    for op in sorted(stats.calls):
        n = stats.calls[op] - before.get(op, (0, 0))[0]
        b = stats.bytes[op] - before.get(op, (0, 0))[1]
        if n:
            out.append(f"{n} {op} ({b / 2**20:.2f} MiB)")
    return ", ".join(out) or "none"


def snapshot(stats):
    return {op: (stats.calls[op], stats.bytes[op]) for op in stats.calls}


def main():
    from mpi4py import MPI

    from hpcpar.comm import Communicator
    from hpcpar.data import MarkovLanguage
    from hpcpar.examples.caches import cache_bytes
    from hpcpar.nn import GPT, Context
    from hpcpar.nn.gpt import preset
    from hpcpar.tensor_parallel import parallelize

    world = MPI.COMM_WORLD
    require_size(world, 2, "tp_gpt")
    tp = Communicator(world, "tp")
    data = MarkovLanguage(32, 2, 4, seq_len=64, seed=SEED)
    ids, targets = data.batch(0, range(BATCH))
    cfg = preset("tiny", vocab_size=32)
    tokens = ids.size
    bsh = BATCH * cfg.seq_len * cfg.d_model * 8
    once(world, f"b x s x h = {BATCH} x {cfg.seq_len} x {cfg.d_model} float64 = {bsh / 2**20:.2f} MiB; "
                f"{cfg.n_layer} blocks")

    one = GPT(cfg, seed=SEED, dtype="float64")          # one rank's model, for comparison
    loss, caches = one.forward(ids, Context(step=0, sample_ids=list(range(BATCH)), seed=SEED), targets)
    blocks = sum(cache_bytes(c) for c in caches[1:1 + cfg.n_layer])
    once(world, f"one rank:          loss {float(loss) / tokens:.12f}; activations kept: blocks "
                f"{blocks / 2**20:.2f} MiB, all {cache_bytes(caches) / 2**20:.2f} MiB")

    for sp in (False, True):
        model = parallelize(GPT(cfg, seed=SEED, dtype="float64"), tp, sequence_parallel=sp)
        ctx = Context(step=0, sample_ids=list(range(BATCH)), seed=SEED)
        if sp:                                         # this rank's positions of the sequence
            k = cfg.seq_len // tp.size
            ctx.seq_slice, ctx.seq_len = slice(tp.rank * k, (tp.rank + 1) * k), cfg.seq_len
        tp.stats.reset()
        loss, caches = model.forward(ids, ctx, targets)
        fwd, fwd_text = snapshot(tp.stats), collectives(tp.stats, {})
        model.backward(1.0 / tokens, caches)
        # (with sequence parallelism the replicated LayerNorm and bias gradients are partial sums:
        # the Trainer all-reduces them once per step, not counted here)
        blocks = sum(cache_bytes(c) for c in caches[1:1 + cfg.n_layer])
        name = "tp 2 + sequence:" if sp else "tp 2:"
        once(world, f"{name:<18} loss {float(loss) / tokens:.12f}; activations kept per rank: blocks "
                    f"{blocks / 2**20:.2f} MiB, all {cache_bytes(caches) / 2**20:.2f} MiB")
        once(world, f"  forward:  {fwd_text}")
        once(world, f"  backward: {collectives(tp.stats, fwd)}")
    once(world, "(bytes are the payload each rank hands to MPI: an all-gather counts its own 1/tp part, "
                "a reduce-scatter its whole input)")
    return 0


if __name__ == "__main__":
    from hpcpar.runtime import run_guarded
    sys.exit(run_guarded(main))
