"""This rank's part of a step's batch: its share of the global batch, cut into micro-batches, each with
its ``Context`` - part of the ``Trainer`` (step.py), which knows the layout and holds the data.

Sample s of step t is the same sequence whichever rank asks (data/), so a data-parallel rank asks for
its own sample ids and the union over ranks is the single-rank batch.  Then, per micro-batch: the
documents' ids (ops/masks.py: the rule, positions restarting, the targets left out), the shifted
targets of the MTP modules (cut with the sequence, after the shift), context parallelism's tokens
(balanced over the cp ranks, by the documents' work when there are documents) and sequence parallelism's
slice of them.  Only the pipeline ranks that read the inputs or the targets draw tokens.
"""
from hpcpar.nn import Context
from hpcpar.nn.mtp import mtp_targets
from hpcpar.ops.masks import Mask, kept_targets
from hpcpar.ops.ring_attention import balanced_positions, document_balance


class Batches:
    def _contexts_and_batches(self, step, data=None, training=True):
        cfg, g, data = self.cfg, self.grid, data or self.data
        base = g.dp_rank * (cfg.batch_size // cfg.dp)
        # every sample is drawn from its own key (seed, step, s), so this rank's share of the batch is
        # drawn in one call and cut into micro-batches: the same tokens as a call per micro-batch, but
        # the synthetic language's loop over positions runs once a step, not once a micro-batch
        share = range(base, base + cfg.microbatches * self.micro)
        xs, ys = data.batch(step, share) if (self.reads_inputs or self.computes_loss) else (None, None)
        docs = data.documents(step, share) if cfg.documents else None        # every rank: (B, T + 1) ids
        inputs, targets, contexts = [], [], []
        for j in range(cfg.microbatches):
            ids, mb = share[j * self.micro:(j + 1) * self.micro], slice(j * self.micro, (j + 1) * self.micro)
            x, y = (None, None) if xs is None else (xs[mb], ys[mb])
            ctx = Context(step=step, sample_ids=list(ids), seed=cfg.seed, training=training,
                          loss_scale=self.scaler.scale / self.loss_terms)     # the dloss of gradients()
            if docs is not None:                              # ops/masks.py: the rule, positions, the loss
                ctx.docs = docs[mb, :-1]
                ctx.keep = None if cfg.boundary_targets else kept_targets(docs[mb])
            if y is not None and getattr(self.mcfg, "mtp_depth", 0):     # (1 + D, B, T): the shifted targets
                y = mtp_targets(y, self.mcfg.mtp_depth,       # of the whole sequence, before CP cuts it; no
                                None if docs is None else docs[mb])      # shift past its own document
            if cfg.cp > 1:                                    # this CP rank's tokens: (B, T) -> (B, T/cp)
                if docs is not None:                          # the deal that balances the documents' work
                    ctx.cp_positions = document_balance(self.mcfg.seq_len, cfg.cp, Mask(ctx.docs))
                    ctx.positions = ctx.cp_positions[g.cp_rank]
                else:
                    ctx.positions = balanced_positions(self.mcfg.seq_len, cfg.cp, g.cp_rank)
                x, y = (None if a is None else a[..., ctx.positions] for a in (x, y))
                ctx.keep = None if ctx.keep is None else ctx.keep[:, ctx.positions]
            if docs is not None and training:
                self.doc_figures.add(ctx)
            inputs.append(self._device(x, self.compute) if self.reads_inputs else None)
            targets.append(self._device(y, self.dtype) if self.computes_loss else None)
            if cfg.sequence_parallel:
                T = self.mcfg.seq_len // cfg.cp                # the tokens this rank holds, cut over TP
                k = T // cfg.tp
                ctx.seq_slice, ctx.seq_len = slice(g.tp_rank * k, (g.tp_rank + 1) * k), T
            contexts.append(ctx)
        return inputs, targets, contexts

    def batch_terms(self, step, data=None):
        """The loss terms of step ``step``'s global batch: every target, or with --documents the targets
        that stay in their document - counted by every rank from the documents alone (no token drawn),
        so every rank divides by the same number."""
        cfg = self.cfg
        if not cfg.documents or cfg.boundary_targets:
            return self.every_term
        return max(1, int(kept_targets((data or self.data).documents(step, range(cfg.batch_size))).sum()))

    def _device(self, a, dtype):
        """Token ids stay integers; real values take ``dtype`` (inputs the compute one, targets the
        master one: a regression target is not rounded to a low precision)."""
        return self.xp.asarray(a, dtype=dtype if a.dtype.kind == "f" else None)
