"""Why explicit caches: micro-batches in flight, recomputation and the B/W split (docs/engine.md).

    .venv/bin/python -m hpcpar.examples.caches

Every module's forward returns ``(output, cache)`` and its backward takes the cache back.  Because a
cache is a plain value that the caller holds, three things that an autograd tape makes hard are a few
lines each here:

 1. micro-batches: two forwards, two caches alive at once, backwards in any order; the gradients add
    up to those of the whole batch
 2. recomputation: a block keeps only its input and rebuilds its cache in backward; same gradients,
    a fraction of the memory
 3. the B/W split: backward with ``defer`` returns the input gradient at once (what the previous
    pipeline stage waits for) and queues the weight gradients to run later

The model is the `tiny` GPT of `hpcpar train` in float64, on step 0's batch of the synthetic language.
"""
import sys

import numpy as np

from hpcpar.nn.module import cache_bytes

BATCH, SEED = 32, 0


def grads(model):
    return {p.name: p.grad.copy() for p in model.parameters()}


def max_rel(a, b):
    return max(float(np.linalg.norm(a[k] - b[k]) / max(np.linalg.norm(b[k]), 1e-300)) for k in b)


def main():
    from hpcpar.data import MarkovLanguage
    from hpcpar.nn import GPT, Context
    from hpcpar.nn.gpt import preset

    data = MarkovLanguage(32, 2, 4, seq_len=64, seed=SEED)
    ids, targets = data.batch(0, range(BATCH))
    cfg = preset("tiny", vocab_size=32)
    tokens = ids.size
    dloss = 1.0 / tokens                       # every micro-batch scales by the *whole* batch's tokens

    def ctx(samples):
        return Context(step=0, sample_ids=list(samples), seed=SEED)

    model = GPT(cfg, seed=SEED, dtype="float64")
    loss, caches = model.forward(ids, ctx(range(BATCH)), targets)
    model.backward(dloss, caches)
    reference = grads(model)
    print(f"whole batch: loss {float(loss) / tokens:.12f}, cache {cache_bytes(caches) / 2**20:.1f} MiB")

    # 1. two micro-batches in flight -------------------------------------------------------------
    model.zero_grad()
    halves = [range(0, 16), range(16, 32)]
    held = []
    for h in halves:                           # forward both: two caches alive at once (GPipe)
        loss_h, cache_h = model.forward(ids[h.start:h.stop], ctx(h), targets[h.start:h.stop])
        held.append((float(loss_h), cache_h))
    print(f"1. micro-batches: two forwards, caches of {cache_bytes(held[0][1]) / 2**20:.1f} + "
          f"{cache_bytes(held[1][1]) / 2**20:.1f} MiB held at once")
    for loss_h, cache_h in reversed(held):     # backwards in the opposite order: nothing cares
        model.backward(dloss, cache_h)
    total = sum(loss_h for loss_h, _ in held) / tokens
    print(f"   loss {total:.12f}; gradients vs the whole batch: max relative difference "
          f"{max_rel(grads(model), reference):.1e}")

    # 2. recomputation -----------------------------------------------------------------------------
    model.zero_grad()
    model.set_recompute(True)
    loss, caches = model.forward(ids, ctx(range(BATCH)), targets)
    kept = cache_bytes(caches)
    model.backward(dloss, caches)              # each block runs its forward again, then its backward
    model.set_recompute(False)
    same = all(np.array_equal(g, reference[k]) for k, g in grads(model).items())
    print(f"2. recomputation: cache {kept / 2**20:.1f} MiB (block inputs and the head's cache); "
          f"gradients bit for bit equal: {same}")

    # 3. the B/W split, on the second of two pipeline stages -----------------------------------------
    first = GPT(cfg, seed=SEED, dtype="float64", layers=range(0, 1), last=False)
    second = GPT(cfg, seed=SEED, dtype="float64", layers=range(1, 2), first=False)
    h, c0 = first.forward(ids, ctx(range(BATCH)))
    loss, c1 = second.forward(h, ctx(range(BATCH)), targets)
    work = []
    dh = second.backward(dloss, c1, defer=work)          # B: the input gradient only
    untouched = all(not p.grad.any() for p in second.parameters())
    print(f"3. B/W split: B returned dL/dh {dh.shape} for the previous stage; weight gradients still "
          f"zero: {untouched}; {len(work)} weight-gradient closures queued")
    for fn in work:                                       # W: whenever the schedule finds time
        fn()
    first.backward(dh, c0)
    split = {p.name: p.grad for p in first.parameters() + second.parameters()}
    # the second stage holds its own copy of the tied embedding: the two gradients add up
    split["wte.weight"] = first.embed.wte.grad + second.head.weight.grad
    print(f"   after W: gradients vs the unsplit whole model: max relative difference "
          f"{max_rel(split, reference):.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
