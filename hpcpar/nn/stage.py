"""A model as a pipeline stage: optional input layer, a run of blocks, optional head with the loss.

    forward(x, ctx, targets) -> (out, caches)   x: model input on the first stage, else hidden states;
                                                out: the summed loss on the last stage, else hidden states
    backward(dy, caches) -> dx                   dy: the loss scale on the last stage, else d(hidden);
                                                dx: None on the first stage (inputs need no gradient)

The single-rank model is the stage that holds everything.  Under ZeRO-3 ``sharding`` (hpcpar/data_parallel/fsdp.py)
gathers each module's parameters before its forward and backward and frees them after.
"""
from hpcpar.nn.module import Module, run_or_defer


class Stage(Module):
    embed = None      # input layer, first stage only
    blocks = ()       # this stage's blocks
    head = None       # output layer and loss, last stage only
    sharding = None   # ZeRO-3's hooks around each module (hpcpar/data_parallel/fsdp.py), or None

    def modules(self):
        """The stage's parts in forward order."""
        return ([self.embed] if self.embed else []) + list(self.blocks) + ([self.head] if self.head else [])

    def mark_matrices(self):
        """Flag the weights Muon orthogonalises (``Parameter.matrix``): every weight of a block with two or
        more dimensions (an expert's (E, in, out): one matrix an expert), but a router's - Moonlight's
        and Kimi's split; the embeddings, the head, the norms and the biases stay AdamW's.  Weights are
        what decays: the experts' biases (E, out) are 2-D and no matrices."""
        for b in self.blocks:
            for p in b.parameters():
                p.matrix = p.decay and p.data.ndim >= 2 and not p.router

    def set_recompute(self, on, attention=False):
        """Full recomputation (each block keeps only its input), or ``attention``: selective, each
        attention core keeps only q, k, v (nn/attention_core.py)."""
        for b in self.blocks:
            b.recompute = on
            if hasattr(b, "attn"):
                b.attn.selective = attention

    def forward(self, x, ctx=None, targets=None):
        caches, modules, hooks = [], self.modules(), self.sharding
        for i, module in enumerate(modules):
            if hooks:
                hooks.before_forward(modules, i)
            x, c = module.forward(x, targets, ctx) if module is self.head else module.forward(x, ctx)
            caches.append(c)
            if hooks:
                hooks.after_forward(modules, i, ctx is not None and ctx.training)
        return x, caches

    def backward(self, dy, caches, defer=None, on_grads_ready=None):
        """Backward through the stage, last part first.

        ``on_grads_ready(params)`` is called as each part's parameter gradients become final - data
        parallelism starts its all-reduces there, overlapping the rest of the backward pass.  A
        parameter shared by two parts (a tied embedding) is final only after the backward of the
        earlier one, so each part reports only the parameters no earlier part holds.
        """
        modules, hooks = self.modules(), self.sharding
        for i, cache, params in zip(reversed(range(len(modules))), reversed(caches), self.grad_groups()):
            if hooks:
                hooks.before_backward(modules, i)
            dy = modules[i].backward(dy, cache, defer)
            if hooks:         # the last backward of the step is the one that reports gradients final
                hooks.after_backward(modules, i, on_grads_ready is not None)
            if on_grads_ready is not None and params:
                run_or_defer(lambda ps=params: on_grads_ready(ps), defer)
        return dy

    def grad_groups(self):
        """What ``backward`` reports to ``on_grads_ready`` at once, in the order it does: one list per
        part, last part first, holding the parameters no earlier part holds (possibly none).  Data
        parallelism cuts its buckets along these groups, so that no bucket waits for a later one."""
        final, earlier = [], set()
        for module in self.modules():
            final.append([p for p in module.parameters() if id(p) not in earlier])
            earlier.update(id(p) for p in module.parameters())
        return final[::-1]
