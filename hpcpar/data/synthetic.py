"""The synthetic sources, drawn from a seed: a Markov language whose entropy floor is known exactly, and a
regression for the deep MLP (hpcpar/data/__init__.py: what every source gives).
"""
import numpy as np

from hpcpar.ops.masks import kept_targets, restart_positions
from hpcpar.runtime import UsageError


def _entropy(p):
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


class MarkovLanguage:
    """Order-k Markov chain over ``vocab`` tokens; each context allows ``branching`` next tokens with
    Dirichlet(alpha) probabilities (small alpha: peaked, low-entropy distributions).  With ``doc_len``
    the stream is documents of 1 .. 2 doc_len - 1 tokens (uniform), each begun afresh from the stationary
    distribution, so nothing in one document predicts the next; ``skip_boundaries``: the targets that
    cross into the next document are left out of the loss (and out of the entropy floor)."""

    def __init__(self, vocab=32, order=2, branching=4, alpha=0.5, seq_len=64, seed=0, doc_len=0,
                 skip_boundaries=True):
        if vocab < 2 or order < 1 or not 1 <= branching <= vocab:
            raise UsageError(f"synthetic language needs vocab >= 2, order >= 1 and 1 <= branching <= vocab "
                             f"(got {vocab}, {order}, {branching})")
        self.vocab_size, self.order, self.seq_len, self.seed, self.doc_len = vocab, order, seq_len, seed, doc_len
        self.n_ctx = vocab ** order                                # contexts = the last k tokens
        rng = np.random.default_rng([seed, 1234])
        self.succ = np.stack([rng.choice(vocab, branching, replace=False) for _ in range(self.n_ctx)])
        self.prob = rng.dirichlet(np.full(branching, alpha), size=self.n_ctx)      # (n_ctx, branching)
        self.cum = np.cumsum(self.prob, axis=1)
        self.cum[:, -1] = 1.0
        self.stationary = self._stationary()
        self.entropy_rate = float(self.stationary @ np.array([_entropy(p) for p in self.prob]))
        self.entropy_floor = self._floor(seq_len) if not doc_len else self._documents_floor(skip_boundaries)

    def _next_ctx(self, ctx, token):
        return (ctx * self.vocab_size) % self.n_ctx + token

    def _stationary(self, iters=2000, tol=1e-13):
        """pi = pi P by (lazy) power iteration: 1/2 (pi + pi P) converges even for a periodic chain."""
        pi = np.full(self.n_ctx, 1.0 / self.n_ctx)
        ctx = np.arange(self.n_ctx)
        for _ in range(iters):
            nxt = np.zeros(self.n_ctx)
            for j in range(self.succ.shape[1]):
                np.add.at(nxt, self._next_ctx(ctx, self.succ[:, j]), pi * self.prob[:, j])
            new = 0.5 * (pi + nxt)
            if np.abs(new - pi).sum() < tol:
                return new
            pi = new
        return pi

    def _floor(self, T):
        """Mean over the T predicted positions of H(x_j | x_0..x_{j-1}), windows starting in stationarity.

        Positions j >= k know their whole context: H = entropy rate.  Positions j < k lie inside the
        initial context drawn from pi:  H(x_j | x_<j) = H(x_0..x_j) - H(x_0..x_{j-1}), which sums to
        H(first k tokens) - H(first token) over j = 1..k-1.
        """
        k, V = self.order, self.vocab_size
        joint = self.stationary.reshape((V,) * k)                  # pi over (x_0, ..., x_{k-1})
        h = [_entropy(joint.sum(axis=tuple(range(m, k))).ravel()) for m in range(1, k + 1)]   # H_1..H_k
        warm = min(k - 1, T)
        return (h[warm] - h[0] + max(0, T - warm) * self.entropy_rate) / T

    def _documents_floor(self, skip_boundaries, windows=512):
        """The floor of windows cut from documents: each target's entropy given its document's tokens
        before it (those of ``_floor`` counted from the document's start), averaged over the targets the
        loss keeps of ``windows`` windows' layouts (key (seed, -1)).  A target that crosses into the
        next document, when kept, is a fresh document's first token: H_1."""
        k, V = self.order, self.vocab_size
        joint = self.stationary.reshape((V,) * k)
        h = [_entropy(joint.sum(axis=tuple(range(m, k))).ravel()) for m in range(1, k + 1)]
        gain = np.array([h[0]] + [h[i] - h[i - 1] for i in range(1, k)] + [self.entropy_rate])    # H(x_i | x_<i)
        docs = self._layouts(np.random.default_rng([self.seed, 2 ** 32 - 1]), windows)
        kept = kept_targets(docs)
        entropy = np.where(kept, gain[np.minimum(restart_positions(docs[:, :-1]) + 1, k)], h[0])
        return float(entropy[kept].mean() if skip_boundaries else entropy.mean())

    def _layouts(self, rng, n):
        """(n, T + 1) document ids of n windows: documents of 1 .. 2 doc_len - 1 tokens, the window
        starting anywhere in the first."""
        T, out = self.seq_len, np.empty((n, self.seq_len + 1), dtype=np.int64)
        for i in range(n):
            lengths = rng.integers(1, 2 * self.doc_len, size=T + 2)
            ends = np.cumsum(lengths) - rng.integers(0, lengths[0])           # where each document ends
            out[i] = np.searchsorted(ends, np.arange(T + 1), side="right")
        return out

    def documents(self, step, sample_ids):
        """(n, T + 1) document ids of the windows, sample s's from the key (seed, step, s, 1)."""
        if not self.doc_len:
            return np.zeros((len(sample_ids), self.seq_len + 1), dtype=np.int64)
        return np.concatenate([self._layouts(np.random.default_rng([self.seed, step, int(s), 1]), 1)
                               for s in sample_ids])

    def _context(self, u):
        """Contexts (last k tokens) drawn from the stationary distribution by uniforms u."""
        ctx = np.searchsorted(np.cumsum(self.stationary), u * self.stationary.sum())
        return np.minimum(ctx, self.n_ctx - 1)

    def batch(self, step, sample_ids):
        """Windows of seq_len + 1 tokens, sample s drawn from the key (seed, step, s); a document that
        starts inside the window begins from a context drawn with the key (seed, step, s, 2)."""
        T, k, V = self.seq_len, self.order, self.vocab_size
        u = np.stack([np.random.default_rng([self.seed, step, int(s)]).random(T + 2) for s in sample_ids])
        since, fresh = None, None                              # each token's place in its document
        if self.doc_len:
            since = restart_positions(self.documents(step, sample_ids))          # (n, T + 1)
            fresh = np.stack([np.random.default_rng([self.seed, step, int(s), 2]).random(T + 1) for s in sample_ids])
        first = ctx = self._context(u[:, 0])                                     # the document's first k tokens
        tokens = np.empty((len(sample_ids), T + 1), dtype=np.int64)
        for j in range(T + 1):
            w = j if since is None else since[:, j]
            if j and fresh is not None and (w == 0).any():                        # documents starting here
                first = np.where(w == 0, self._context(fresh[:, j]), first)
            warm = w < k                                                          # within the first k tokens
            if warm is True or (since is not None and warm.all()):
                tokens[:, j], ctx = (first // V ** (k - 1 - w)) % V, first
                continue
            pick = (u[:, j + 1, None] > self.cum[ctx]).sum(axis=1)              # inverse CDF
            tok = self.succ[ctx, np.minimum(pick, self.succ.shape[1] - 1)]
            ctx = self._next_ctx(ctx, tok)
            if since is not None and warm.any():
                tok = np.where(warm, (first // V ** np.maximum(k - 1 - w, 0)) % V, tok)
                ctx = np.where(warm, first, ctx)
            tokens[:, j] = tok
        return tokens[:, :-1], tokens[:, 1:]


class Regression:
    """y = tanh(x A) B for x ~ N(0, 1): a smooth target for the deep MLP (its floor is 0)."""

    def __init__(self, d_in, d_out, seed=0):
        rng = np.random.default_rng([seed, 99])
        self.A = rng.standard_normal((d_in, d_in)) / np.sqrt(d_in)
        self.B = rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)
        self.d_in, self.seed, self.entropy_floor = d_in, seed, None

    def batch(self, step, sample_ids):
        x = np.stack([np.random.default_rng([self.seed, step, int(s)]).standard_normal(self.d_in)
                      for s in sample_ids])
        return x, np.tanh(x @ self.A) @ self.B
