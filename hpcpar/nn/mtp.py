"""Multi-token prediction (DeepSeek-V3 report, section 2.2): D modules after the model's last block, module k
predicting the token k + 1 places after the next, through the model's own embedding and output head.

With t_i the token at position i, h^0_i = norm(x_i) the model's final hidden state (after its final norm,
as transformers' MtpModel and the inference engines take it) and E, W the shared embedding and head:

    u^k_i = W_eh [enorm_k(E t_{i+k}) | hnorm_k(h^{k-1}_i)]     (B, T, 2C) -> (B, T, C)   eh_proj, no bias
    h^k_i = post_norm_k(Block_k(u^k_i))                          a transformer block (causal attention)
    L_k   = sum over i with t_{i+k+1} in the sequence of CE(h^k_i W^T, t_{i+k+1})
    loss  = L_main + (lambda / D) sum_k L_k                      each sum later times 1 / (tokens in the batch)

h^k feeds module k + 1 and the head; its gradient therefore comes from both, and h^0's joins the main
loss's before the final norm (nn/head.py).  The targets are one array (1 + D, B, T) (``mtp_targets``):
row 0 the usual next tokens, row k those k further on, -1 past the end of the sequence; row k - 1 is
also module k's input E t_{i+k}.  The shift is done on the whole sequence before context parallelism
cuts it, so a rank's positions find their shifted tokens wherever they sit in the sequence.

On a pipeline the modules sit on the last stage, with the head.  Their embedding is the model's: the
first stage's when the same rank holds it, else a copy whose gradient is summed with the first
stage's (training/gradient_sums.py, the tied embedding's sum between the two ends).  Names are DeepSeek's: module k's
parameters are those of layer n_layer + k - 1 (layers.61 in V3), with its enorm, hnorm, eh_proj and
shared_head.norm; the embedding and head copies a checkpoint holds there are the model's
(checkpoint/deepseek_v3.py).
"""
import numpy as np

from hpcpar.backend import array_module
from hpcpar.nn.embedding import Embedding
from hpcpar.nn.linear import Linear
from hpcpar.nn.module import Module, run_or_defer


def mtp_targets(targets, depth, documents=None):
    """targets (B, T) -> (1 + depth, B, T): row k the targets k positions on, -1 where that runs past the
    end.  ``documents`` (B, T + 1), the document ids of the inputs and the last target, or None: with
    packed documents a module's target in another document than the position that predicts it is -1 too
    (no position predicts past its own document; row 0's are the loss mask's business, ctx.keep)."""
    B, T = targets.shape
    out = np.full((1 + depth, B, T), -1, dtype=np.int64)
    for k in range(1 + depth):
        out[k, :, :T - k] = targets[:, k:]
        if documents is not None and k:                 # position t predicts token t + 1 + k
            out[k, :, :T - k][documents[:, 1 + k:] != documents[:, :T - k]] = -1
    return out


class MTPModule(Module):
    """Depth k: the two norms, the 2C -> C projection, a block of the model's family, the final norm."""

    def __init__(self, cfg, k, seed, dtype):
        layer = cfg.n_layer + k - 1
        prefix, norm = f"layers.{layer}", cfg.parts.norm
        self.enorm = norm(f"{prefix}.enorm", cfg.d_model, seed, dtype, cfg.ln_eps)
        self.hnorm = norm(f"{prefix}.hnorm", cfg.d_model, seed, dtype, cfg.ln_eps)
        self.eh_proj = Linear(f"{prefix}.eh_proj", 2 * cfg.d_model, cfg.d_model, 0.02, seed, dtype, bias=False)
        self.block = cfg.parts.block(cfg, layer, seed, dtype)
        self.post_norm = norm(f"{prefix}.shared_head.norm", cfg.d_model, seed, dtype, cfg.ln_eps)

    def forward(self, e, h, ctx):
        """e = E t_{i+k}, h = h^{k-1} (B, T, C) -> h^k, cache"""
        a, c_e = self.enorm.forward(e, ctx)
        b, c_h = self.hnorm.forward(h, ctx)
        u, c_u = self.eh_proj.forward(array_module(a).concatenate([a, b], axis=-1), ctx)
        y, c_b = self.block.forward(u, ctx)
        hk, c_n = self.post_norm.forward(y, ctx)
        return hk, (c_e, c_h, c_u, c_b, c_n)

    def backward(self, dhk, cache, defer=None):
        """dhk (B, T, C) -> de (the embedding's), dh (h^{k-1}'s)"""
        c_e, c_h, c_u, c_b, c_n = cache
        du = self.eh_proj.backward(self.block.backward(self.post_norm.backward(dhk, c_n, defer), c_b, defer),
                                   c_u, defer)                                     # (B, T, 2C)
        C = du.shape[-1] // 2
        return self.enorm.backward(du[..., :C], c_e, defer), self.hnorm.backward(du[..., C:], c_h, defer)

    def replicated(self):
        """The parameters tensor parallelism keeps whole (its block is cut like any other)."""
        return [p for m in (self.enorm, self.hnorm, self.eh_proj, self.post_norm) for p in m.parameters()]


class MTP(Module):
    """The D modules of a last stage, and the token lookup on the model's embedding ``wte``."""

    def __init__(self, cfg, wte, seed, dtype):
        self.embed = Embedding.lookup(wte)            # tensor parallelism swaps in the vocabulary-parallel one
        self.depths = [MTPModule(cfg, k, seed, dtype) for k in range(1, cfg.mtp_depth + 1)]
        self.scale = cfg.mtp_lambda / cfg.mtp_depth   # of each module's loss sum
        self.loss_sum = 0.0                           # this step's sum of weight * L_k, added in backward

    def blocks(self):
        return [m.block for m in self.depths]

    def forward(self, h0, targets, ctx, head):
        """h0 (B, T, C) the normalised last hidden state, targets (1 + D, B, T), ``head`` the shared
        projection (nn/head.py) -> the modules' caches (their losses are added in the backward)."""
        h, caches = h0, []
        for k, module in enumerate(self.depths, 1):
            ids, wanted = targets[k - 1], targets[k]                   # t_{i+k} (input), t_{i+k+1} (target)
            xp = array_module(ids)
            e, c_tok = self.embed.tokens_forward(xp.where(ids >= 0, ids, 0), ctx)
            h, c_mod = module.forward(e, h, ctx)
            valid = wanted >= 0
            loss, c_out = head.project_forward(h, xp.where(valid, wanted, 0), valid)
            caches.append((c_tok, c_mod, c_out, loss))
        return caches

    def backward(self, dloss, caches, defer, head):
        """-> d h0 (B, T, C); the embedding's and every module's gradients accumulated."""
        dh = None
        for module, (c_tok, c_mod, c_out, loss) in zip(reversed(self.depths), reversed(caches)):
            dhk = head.project_backward(dloss * self.scale, c_out, defer)
            if dh is not None:
                dhk += dh                                              # h^k also fed module k + 1
            de, dh = module.backward(dhk, c_mod, defer)
            run_or_defer(lambda de=de, c=c_tok: self.embed.tokens_weight_grad(de, c), defer)
            self.loss_sum = self.loss_sum + self.scale * loss      # on the device, read once a step
        return dh

    def take_loss_sum(self):
        """This step's weighted loss sum so far, and a fresh start."""
        total, self.loss_sum = self.loss_sum, 0.0
        return total
