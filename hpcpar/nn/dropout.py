"""nn.Dropout with masks that do not depend on the parallel layout.

Each sample's mask is drawn whole from the key (seed, step, site, global sample index) and then cut to
the part this rank holds (its heads, or its sequence positions under sequence parallelism).  So one
rank, any tensor-parallel split, any pipeline and any data-parallel split drop exactly the same
units - and recomputation redraws the same mask.  Masks are drawn on the host with numpy (cheap next
to the GEMMs, and identical across backends).
"""
import zlib

import numpy as np

from hpcpar.nn.module import Module
from hpcpar.ops.dropout import dropout_backward, dropout_forward, dropout_mask


class Dropout(Module):
    def __init__(self, site, p):
        self.site = zlib.crc32(site.encode())
        self.p = p

    def mask(self, ctx, batch, sample_shape, region, dtype, xp):
        """(batch, *region shape) mask, or None when dropout is off. ``region``: slices of one sample."""
        if not self.p or ctx is None or not ctx.training:
            return None
        ids = ctx.sample_ids if ctx.sample_ids is not None else range(batch)
        masks = [dropout_mask((ctx.seed, ctx.step, self.site, int(s)), sample_shape, self.p, dtype)[region]
                 for s in ids]
        return xp.asarray(np.stack(masks))

    def forward(self, x, ctx, sample_shape=None, region=()):
        """x (B, ...) -> (y, mask). Default: x holds whole samples."""
        from hpcpar.backend import array_module
        mask = self.mask(ctx, x.shape[0], sample_shape or x.shape[1:], region, x.dtype, array_module(x))
        return (x, None) if mask is None else (dropout_forward(x, mask), mask)

    def forward_tokens(self, x, ctx):
        """Dropout on token activations x (B, T_local, C): under sequence parallelism x holds positions
        ctx.seq_slice of the full sequence ctx.seq_len, and the mask is cut accordingly."""
        if ctx is None or ctx.seq_slice is None:
            return self.forward(x, ctx)
        return self.forward(x, ctx, (ctx.seq_len, x.shape[2]), (ctx.seq_slice, slice(None)))

    def backward(self, dy, mask, defer=None):
        return dy if mask is None else dropout_backward(dy, mask)
