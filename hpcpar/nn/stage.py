"""A model as a pipeline stage: optional input layer, a run of blocks, optional head with the loss.

    forward(x, ctx, targets) -> (out, caches)   x: model input on the first stage, else hidden states;
                                                out: the summed loss on the last stage, else hidden states
    backward(dy, caches, defer, final) -> dx     dy: the loss scale on the last stage, else d(hidden);
                                                dx: None on the first stage (inputs need no gradient)

The single-rank model is the stage that holds everything.  What runs around the model - data
parallelism's gradient sums, ZeRO-3's gathers - enters through one door, the stage's ``hooks``
(``StageHooks``): called around each module's forward and backward, and told when gradients are final.
"""
from hpcpar.nn.module import Module, run_or_defer


class StageHooks:
    """The one door from the model into what runs around it.  A stage calls these around each of its
    ``modules`` (i: the module's place in them) and reports its parameters' gradients as they become
    final.  This default does nothing; data parallelism's two implementations
    (hpcpar/data_parallel/protocol.py ``Replicas``) override it: DataParallel starts each bucket's sum in
    ``grads_ready``, FullyShardedDataParallel also gathers and frees its units around each module.  The
    one other way in is a global, for the communication in flight between GEMMs: hpcpar/inflight.py."""

    def before_forward(self, modules, i):
        pass

    def after_forward(self, modules, i, training):
        pass

    def before_backward(self, modules, i):
        pass

    def after_backward(self, modules, i, final):
        """``final``: the module's last backward of the step."""

    def grads_ready(self, params):
        """The gradients of ``params`` are final for this step (each parameter reported once)."""


class Stage(Module):
    embed = None            # input layer, first stage only
    blocks = ()             # this stage's blocks
    head = None             # output layer and loss, last stage only
    hooks = StageHooks()    # the door (above): nothing, unless data parallelism attaches itself

    def modules(self):
        """The stage's parts in forward order."""
        return ([self.embed] if self.embed else []) + list(self.blocks) + ([self.head] if self.head else [])

    def transformer_blocks(self):
        """Every transformer block of the stage: its run, and the MTP modules' (nn/mtp.py) on the last."""
        mtp = getattr(self.head, "mtp", None)
        return list(self.blocks) + (mtp.blocks() if mtp is not None else [])

    def mark_matrices(self):
        """Flag the weights Muon orthogonalises (``Parameter.matrix``): every weight of a block with two or
        more dimensions (an expert's (E, in, out): one matrix an expert), but a router's - Moonlight's
        and Kimi's split; the embeddings, the head, the norms and the biases stay AdamW's.  Weights are
        what decays: the experts' biases (E, out) are 2-D and no matrices."""
        for b in self.transformer_blocks():
            for p in b.parameters():
                p.matrix = p.decay and p.data.ndim >= 2 and not p.router

    def set_recompute(self, on, attention=False):
        """Full recomputation (each block keeps only its input), or ``attention``: selective, each
        attention core keeps only q, k, v (nn/attention_core.py)."""
        for b in self.transformer_blocks():
            b.recompute = on
            if hasattr(b, "attn"):
                b.attn.selective = attention

    def forward(self, x, ctx=None, targets=None):
        caches, modules, hooks = [], self.modules(), self.hooks
        for i, module in enumerate(modules):
            hooks.before_forward(modules, i)
            x, c = module.forward(x, targets, ctx) if module is self.head else module.forward(x, ctx)
            caches.append(c)
            hooks.after_forward(modules, i, ctx is not None and ctx.training)
        return x, caches

    def backward(self, dy, caches, defer=None, final=False):
        """Backward through the stage, last part first.

        ``final``: this is the stage's last backward of the step, so each part's parameter gradients
        become final as it finishes (its weight gradients, when ``defer`` queues them for a later W):
        the stage reports them through ``hooks.grads_ready`` - data parallelism starts its sums there,
        overlapping the rest of the backward pass.  A parameter shared by two parts (a tied embedding)
        is final only after the backward of the earlier one, so each part reports only the parameters
        no earlier part holds.
        """
        modules, hooks = self.modules(), self.hooks
        for i, cache, params in zip(reversed(range(len(modules))), reversed(caches), self.grad_groups()):
            hooks.before_backward(modules, i)
            dy = modules[i].backward(dy, cache, defer)
            hooks.after_backward(modules, i, final)
            if final and params:
                run_or_defer(lambda ps=params: hooks.grads_ready(ps), defer)
        return dy

    def grad_groups(self):
        """What ``backward`` reports to ``hooks.grads_ready`` at once, in the order it does: one list per
        part, last part first, holding the parameters no earlier part holds (possibly none).  Data
        parallelism cuts its buckets along these groups, so that no bucket waits for a later one."""
        final, earlier = [], set()
        for module in self.modules():
            final.append([p for p in module.parameters() if id(p) not in earlier])
            earlier.update(id(p) for p in module.parameters())
        return final[::-1]
