"""The head of a GPT's last stage: final norm, logits = h W^T with W (V, C) the (tied) token embedding or a
matrix of its own, summed cross-entropy - and, with multi-token prediction, the MTP modules (nn/mtp.py),
which read the normalised h and predict through the same W.

    forward(x (B, T, C), targets, ctx) -> loss sum, cache      targets (B, T), or (1 + D, B, T) with D MTP
                                                               modules: row k the token k after the next
    backward(dloss, cache) -> dx (B, T, C)                     the MTP modules' gradient joins the main
                                                               one's before the final norm

``project_forward`` / ``project_backward`` are the projection and loss of a normalised h alone: the main
prediction's and each MTP module's.  A row whose target is -1 (an MTP module's positions past the end of
the sequence or its document) counts nothing, and with documents neither does a main target that crosses
into the next document (``ctx.keep`` False).  Tensor parallelism (tensor_parallel/layers.py) keeps this code and
overrides the four methods at the end: where h is gathered and dh summed over the ranks, and the loss
over a vocabulary slice.
"""
from hpcpar.backend import array_module
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.ops.cross_entropy import cross_entropy_backward, cross_entropy_forward
from hpcpar.ops.linear import linear_backward_input, linear_backward_weight, linear_forward
from hpcpar.precision import to_fp32


class LMHead(Module):
    def __init__(self, cfg, weight, seed, dtype, mtp=None):
        self.ln_f = cfg.parts.norm(cfg.parts.final_norm, cfg.d_model, seed, dtype, cfg.ln_eps)
        self.weight = weight
        self.mtp = mtp                  # the MTP modules (nn/mtp.py), or None

    def forward(self, x, targets, ctx=None):
        h, c_ln = self.ln_f.forward(x, ctx)                        # (B, T, C)
        keep = getattr(ctx, "keep", None)                          # (B, T): targets kept (documents)
        keep = None if keep is None else array_module(h).asarray(keep).astype(bool)
        loss, c_out = self.project_forward(h, targets if self.mtp is None else targets[0], keep)
        c_mtp = None if self.mtp is None else self.mtp.forward(h, targets, ctx, self)
        return loss, (c_ln, c_out, c_mtp)

    def forward_cached(self, x):
        """Forward only, for generation: logits (B, T, V) of the hidden states x (B, T, C), no loss."""
        return linear_forward(self.ln_f.forward(x)[0], self.weight.data.T)

    def backward(self, dloss, cache, defer=None):
        c_ln, c_out, c_mtp = cache
        dh = self.project_backward(dloss, c_out, defer)
        if c_mtp is not None:
            dh += self.mtp.backward(dloss, c_mtp, defer, self)
        return self.ln_f.backward(dh, c_ln, defer)

    def project_forward(self, h, targets, valid=None):
        """The summed loss of the normalised h (B, T, C) against ``targets`` (B, T); ``valid`` (B, T): the
        rows that count (None: all)."""
        h = self.gather_hidden(h)                                  # (B, T, C)
        h2 = h.reshape(-1, h.shape[-1])                            # (N, C)
        logits = linear_forward(h2, self.weight.data.T, fp32=True)     # (N, V), the fp32 sum
        rows = None if valid is None else valid.reshape(-1)
        losses, c_ce = self.loss_forward(to_fp32(logits), targets.reshape(-1))   # the loss in fp32
        if rows is not None:
            losses = losses * rows
        return losses.sum(), (h.shape, h2, c_ce, rows)

    def project_backward(self, dloss, cache, defer=None):
        """dloss, the weight of the summed loss -> dh (B, T, C) of the normalised h (summed over TP)."""
        shape, h2, c_ce, rows = cache
        dlogits = self.loss_backward(dloss if rows is None else dloss * rows, c_ce).astype(h2.dtype, copy=False)
        run_or_defer(lambda: self._weight_grad(dlogits, h2), defer)
        dh = linear_backward_input(dlogits, self.weight.data.T)    # (N, C)
        return self.reduce_hidden_grad(dh.reshape(shape))

    def _weight_grad(self, dlogits, h2):
        linear_backward_weight(h2, dlogits, bias=False, into=(self.weight.grad, None))   # dW = dlogits^T h2 (V, C)

    # --- one rank holds the whole vocabulary: nothing to gather or sum ---------------------------

    def gather_hidden(self, h):
        return h

    def reduce_hidden_grad(self, dh):
        return dh

    def loss_forward(self, logits, targets):
        return cross_entropy_forward(logits, targets)

    def loss_backward(self, dloss, c_ce):
        return cross_entropy_backward(dloss, c_ce)
