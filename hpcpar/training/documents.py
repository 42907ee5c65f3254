"""What --documents did to a run's attention, counted from the micro-batches' documents (ops/masks.py):
the end-of-run summary's "documents" line and the profile's "attention work" line.

    windows, documents     how many of each this rank's micro-batches held
    span                   keys per token the FLOP count charges (shape.attention_span): the MFU's
    work                   score entries the attention blocks computed on this rank, against those the
                           plain causal blocks would have (ops/attention.blocks_work; the ring's trimmed
                           blocks, ring_attention.block_entries): the work the skipped key blocks saved
    ring                   the busiest cp rank's work (keys its queries see) over the mean, for the
                           micro-batches' deals (document_balance) and for the causal balance alone

Every figure is computed from the documents alone - no array is touched - on the host.
"""
import numpy as np

from hpcpar.ops.attention import blocks_work
from hpcpar.ops.masks import Mask, document_lengths
from hpcpar.ops.ring_attention import balanced_positions, block_entries, rank_work
from hpcpar.shape import attention_span


class DocumentFigures:
    def __init__(self, seq_len, cp, cp_rank, ring, block):
        """``block``: the query rows per block of this rank's attention (ops/attention.engine_block)."""
        self.T, self.cp, self.rank, self.ring, self.block = seq_len, cp, cp_rank, ring, block
        self.windows = self.documents = 0
        self.span = 0.0
        self.done = self.plain = 0
        self.busiest = {"dealt": [], "causal": []}

    def add(self, ctx):
        """One micro-batch's figures, from its context (ctx.docs, ctx.cp_positions)."""
        docs, mask = ctx.docs, Mask(ctx.docs)
        lengths = [document_lengths(row) for row in docs]
        self.windows += len(docs)
        self.documents += sum(len(n) for n in lengths)
        self.span += sum(attention_span(n) for n in lengths)
        if self.cp > 1 and self.ring:
            done, plain = block_entries(ctx.cp_positions, self.rank, mask)
        else:
            done, plain = blocks_work(self.T, self.block, mask)
            done, plain = done * len(docs), plain * len(docs)
        self.done, self.plain = self.done + done, self.plain + plain
        if self.cp > 1:
            causal = [balanced_positions(self.T, self.cp, r) for r in range(self.cp)]
            for name, positions in (("dealt", ctx.cp_positions), ("causal", causal)):
                work = rank_work(positions, mask)
                self.busiest[name].append(max(work) / np.mean(work))

    def mean_span(self):
        return self.span / max(1, self.windows)

    def line(self):
        """The summary's line."""
        text = (f"  documents   {self.documents / max(1, self.windows):.1f} per window of {self.T}; attention "
                f"charged {self.mean_span():.1f} keys a token (plain causal {self.T})")
        if self.busiest["dealt"]:
            text += (f"; ring work of the busiest cp rank {np.mean(self.busiest['dealt']):.2f}x the mean "
                     f"(the causal balance alone: {np.mean(self.busiest['causal']):.2f}x)")
        return text

    def work_line(self):
        """The profile's line: the work the attention blocks skipped."""
        return (f"  attention work: {self.done / max(1, self.plain):.1%} of the plain causal blocks' score "
                f"entries computed (key blocks of other documents skipped)")
