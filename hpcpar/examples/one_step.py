"""One training step on one rank, traced call by call with shapes (docs/engine.md).

    .venv/bin/python -m hpcpar.examples.one_step              # block 0 in detail, block 1 as one line
    .venv/bin/python -m hpcpar.examples.one_step --expand 2   # every block in detail

The step that `hpcpar train --model tiny --dtype float64` takes first, written out:

 1. data     step 0's batch of the synthetic Markov language: 32 sequences of 64 tokens (data/synthetic.py)
 2. model    the `tiny` GPT (2 blocks, 4 heads, width 64), initialised from seed 0 (nn/gpt.py)
 3. forward  every module returns its output and a cache; the last one returns the summed loss
 4. backward starts from dloss = 1 / (tokens in the batch) and runs the caches in reverse
 5. norm     the global gradient norm, clipping if it exceeds 1
 6. update   AdamW with the warm-up learning rate of step 0

At the end the example checks the numbers against hpcpar's Trainer, the code behind `hpcpar train`.
The tracer only wraps functions from the outside (a printed line per call); the engine does not
know it is being watched.
"""
import argparse
import math
import sys

import numpy as np

SEED, BATCH = 0, 32


class Tracer:
    """Records one line per traced call: depth, label, input shape, output shape."""

    def __init__(self):
        self.lines, self.depth, self.restore, self.muted = [], 0, [], 0

    def wrap(self, owner, attr, label, describe, mute_inside=False):
        """Replace ``owner.attr`` (a method or a module-level function) by a recording wrapper.
        ``mute_inside``: record this call but none of the calls it makes."""
        fn = getattr(owner, attr)

        def traced(*args, **kwargs):
            entry = [self.depth, label, describe(args), ""]
            if not self.muted:
                self.lines.append(entry)
            self.depth += 1
            self.muted += mute_inside
            try:
                out = fn(*args, **kwargs)
            finally:
                self.depth -= 1
                self.muted -= mute_inside
            entry[3] = _shape(out[0] if isinstance(out, tuple) and "forward" in attr else out)
            return out
        setattr(owner, attr, traced)
        self.restore.append((owner, attr, fn))

    def undo(self):
        for owner, attr, fn in reversed(self.restore):
            if isinstance(owner, type(sys)):
                setattr(owner, attr, fn)
            else:
                delattr(owner, attr)                 # the instance falls back to its class's method
        self.restore = []

    def dump(self, title):
        print(title)
        for depth, label, inp, out in self.lines:
            arrow = f"{inp} -> {out}" if out else inp
            print(f"  {'  ' * depth}{label:<{34 - 2 * depth}} {arrow}")
        self.lines = []


def _shape(a):
    if a is None:
        return "None"
    if np.isscalar(a) or getattr(a, "ndim", 1) == 0:
        return f"{float(a):.6f}"
    if isinstance(a, (tuple, list)):
        return ", ".join(_shape(x) for x in a)
    return str(tuple(a.shape))


def first(args):
    return _shape(args[0])


def trace_model(tracer, model, expand):
    """Wrap the stage's modules (and the ops that are not modules) for both passes."""
    from hpcpar.nn import attention_core, head, mlp

    def both(module, label, mute_inside=False):
        tracer.wrap(module, "forward", label, first, mute_inside)
        tracer.wrap(module, "backward", label, first, mute_inside)

    both(model.embed, "embedding (wte[ids] + wpe)")
    for i, block in enumerate(model.blocks):
        both(block, f"block h.{i}" + ("" if i < expand else " (not expanded)"), mute_inside=i >= expand)
        if i >= expand:
            continue
        both(block.ln_1, "ln_1")
        both(block.attn, "attn")
        both(block.attn.c_attn, "c_attn   [Q|K|V] = x W + b")
        both(block.attn.c_proj, "c_proj   (row of heads) W + b")
        both(block.ln_2, "ln_2")
        both(block.mlp, "mlp")
        both(block.mlp.c_fc, "c_fc     x W + b")
        both(block.mlp.c_proj, "c_proj   h W + b")
    tracer.wrap(model.head, "forward", "head: loss summed over tokens", first)
    tracer.wrap(model.head, "backward", "head", lambda a: f"dloss {float(a[0]):.3e}")
    both(model.head.ln_f, "ln_f")
    # ops called as plain functions inside the modules: wrap them where those modules look them up
    tracer.wrap(attention_core, "attention_forward", "softmax(Q K^T/sqrt(HS) + M) V", first)
    tracer.wrap(attention_core, "attention_backward", "dQ, dK, dV", first)
    tracer.wrap(mlp, "gelu_forward_fast", "gelu", first)
    tracer.wrap(mlp, "gelu_backward_fast", "gelu'", first)
    tracer.wrap(head, "linear_forward", "logits = h wte^T", first)
    tracer.wrap(head, "cross_entropy_forward", "cross-entropy per token", first)
    tracer.wrap(head, "cross_entropy_backward", "softmax - onehot", lambda a: f"dloss {float(a[0]):.3e}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expand", type=int, default=1, help="blocks traced in detail (default 1)")
    args = parser.parse_args(argv)

    from hpcpar.data_parallel.flat import FlatSlice
    from hpcpar.data import MarkovLanguage
    from hpcpar.nn import GPT, Context
    from hpcpar.nn.gpt import preset
    from hpcpar.optim import AdamW, clip_coefficient, learning_rate

    np.set_printoptions(precision=4, suppress=True)
    # 1. data: the defaults of `hpcpar train` (--synthetic-vocab 32 --synthetic-order 2 ...)
    data = MarkovLanguage(vocab=32, order=2, branching=4, seq_len=64, seed=SEED)
    ids, targets = data.batch(0, range(BATCH))
    print(f"data     Markov language: V = {data.vocab_size}, order {data.order}, entropy floor "
          f"{data.entropy_floor:.6f} nats/token (uniform guessing: ln 32 = {math.log(32):.6f})")
    print(f"         batch of step 0: ids {ids.shape}, targets {targets.shape} (= ids shifted by one)")
    print(f"         sequence 0 starts {ids[0, :12].tolist()}")

    # 2. model
    cfg = preset("tiny", vocab_size=data.vocab_size)
    model = GPT(cfg, seed=SEED, dtype="float64")
    params = model.parameters()
    print(f"model    GPT {cfg.n_layer} blocks, {cfg.n_head} heads, d_model {cfg.d_model}, d_ff {cfg.d_ff}, "
          f"tied: {sum(p.data.size for p in params):,} parameters in {len(params)} tensors")
    ctx = Context(step=0, sample_ids=list(range(BATCH)), seed=SEED)

    # 3. forward, traced
    tracer = Tracer()
    trace_model(tracer, model, args.expand)
    try:
        loss_sum, caches = model.forward(ids, ctx, targets)
        tracer.dump("forward  (module or op, input shape -> output shape)")
        tokens = ids.size
        print(f"         loss = sum / tokens = {float(loss_sum):.6f} / {tokens} = {float(loss_sum) / tokens:.12f}")

        # 4. backward, traced: the loss was a sum, so dloss = 1/tokens gives the gradient of the mean
        model.backward(1.0 / tokens, caches)
        tracer.dump("backward (module or op, gradient in -> gradient out; the same calls in reverse)")
    finally:
        tracer.undo()

    # 5. gradient norm and clipping
    norm = math.sqrt(sum(float((p.grad * p.grad).sum()) for p in params))
    coef = clip_coefficient(norm, 1.0)
    print(f"norm     global gradient norm {norm:.6f}; clip coefficient {coef:g} (clipping only above 1.0)")
    biggest = sorted(params, key=lambda p: -float(np.linalg.norm(p.grad)))[:3]
    print("         largest gradients: " + ", ".join(f"{p.name} {float(np.linalg.norm(p.grad)):.4f}"
                                                   for p in biggest))

    # 6. AdamW update, one flat slice per parameter (the Trainer uses bucket-sized slices: same arithmetic)
    lr = learning_rate(0, 1e-2, 1e-3, 10, 100)
    opt = AdamW(lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    slices = [FlatSlice(p.name, p.data.reshape(-1), p.grad.reshape(-1), [(0, p.data.size)] if p.decay else [])
              for p in params]
    before = model.blocks[0].attn.c_attn.weight.data[0, :3].copy()
    opt.step(slices, lr)
    after = model.blocks[0].attn.c_attn.weight.data[0, :3]
    print(f"update   AdamW, lr {lr:g} (step 0 of a 10-step warm-up to 1e-2), betas (0.9, 0.95), weight decay 0.1")
    print(f"         h.0.attn.c_attn.weight[0, :3] {before} -> {after}")
    print("         (Adam's first step moves every weight by about lr: m/sqrt(v) = g/|g| = +-1)")
    model.zero_grad()

    # the next step's batch, with the updated weights
    ids1, targets1 = data.batch(1, range(BATCH))
    loss1 = float(model.forward(ids1, Context(step=1, sample_ids=list(range(BATCH)), seed=SEED), targets1)[0])
    loss1 /= ids1.size
    print(f"next     loss on step 1's batch after the update: {loss1:.12f}")

    # the same step through the Trainer (flat buckets, the pipeline engine with one stage, AdamW)
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    t = Trainer(TrainConfig(model="tiny", dtype="float64", steps=100, progress=False, seed=SEED))
    r0, r1 = t.step(0), t.step(1)
    print(f"check    Trainer: step 0 loss {r0.loss:.12f}, grad norm {r0.grad_norm:.6f}; step 1 loss {r1.loss:.12f}")
    same = abs(r0.loss - float(loss_sum) / tokens) < 1e-12 and abs(r1.loss - loss1) < 1e-12
    print("         same numbers as the hand-written step: " + ("yes" if same else "NO"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
