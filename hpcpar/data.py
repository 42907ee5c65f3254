"""Training data, with a batch order fixed by (seed, step) alone.

Sample ``s`` of step ``t``'s global batch is the same sequence whichever rank asks for it, so a data-
parallel rank asks for its own sample ids (``dp_rank * B/dp ...``) and the union over ranks is exactly
the single-rank batch.  Three sources:

* ``MarkovLanguage`` - a synthetic language: a seeded random Markov chain of order k over V tokens.
  Its entropy rate is computed exactly, so the best loss any model can reach (the *entropy floor*) is
  known and a training run can be judged against it.  Sample (t, s) is generated from the key
  (seed, t, s): endless fresh data, no files.
* ``TokenFile`` - a token stream: a character-level text file (vocabulary = its sorted characters) or a
  uint16/uint32 token file in nanoGPT's ``.bin`` layout, read through ``np.memmap`` (a directory written
  by ``hpcpar data prepare`` holds train.bin, val.bin and a meta.json that names the dtype and the
  vocabulary, which may be larger than the ids the file happens to use).  Order "random":
  step t's B window starts are drawn from the key (seed, t); order "sequential": sample s of step t
  starts at ((t * B + s) * T) modulo the usable length - consecutive windows from the start of the file.
* ``Regression`` - inputs and targets of a fixed random teacher, for the deep MLP model.

``batch(step, sample_ids)`` returns (inputs, targets): token windows (n, T) and the same shifted by one,
or (n, D_in) and (n, D_out) arrays.  ``documents(step, sample_ids)`` (the two token sources) gives the
document id of each of a window's T + 1 tokens (n, T + 1), 0 for the window's first piece and up by one
at each document start (ops/masks.py reads them): the synthetic language's documents have random
lengths (``doc_len`` on average; 0: one endless document), a prepared directory's start where
``hpcpar data prepare`` recorded (train.starts.npy beside train.bin; a directory without one, or any
other file, is one long document).  The layout is drawn apart from the tokens, so every rank knows
every window's documents - and the tokens the loss counts - without drawing a token.
"""
import json
import math
from pathlib import Path

import numpy as np

from hpcpar.ops.masks import documents_of, kept_targets, restart_positions
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


# what a value of a JSON file hpcpar reads must be: the test, and the words of the message
KINDS = {"count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a whole number >= 0"),
         "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
                    "a finite number >= 0"),
         "bool": (lambda v: isinstance(v, bool), "true or false"),
         "text": (lambda v: isinstance(v, str), "a string"),
         "list": (lambda v: isinstance(v, list), "a list"),
         "object": (lambda v: isinstance(v, dict), "an object")}


def check_value(where, key, value, kind):
    """Refuse ``value`` unless it is of ``kind`` (a key of KINDS; "kind?" also allows null)."""
    if kind.endswith("?") and value is None:
        return
    holds, words = KINDS[kind.rstrip("?")]
    if not holds(value):
        raise UsageError(f"{where}: {key} must be {words}, not {value!r}")


def read_optional_json(path, what="", types=None):
    """The JSON object in ``path``, or {} when there is no such file; one line (``what`` first) when it is
    unreadable, not an object, or one of its keys in ``types`` ({key: kind of KINDS}) is of another kind."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"{what}cannot read {path}: {err}") from None
    if not isinstance(obj, dict):
        raise UsageError(f"{what}{path} must hold a JSON object, not {type(obj).__name__}")
    for key, kind in (types or {}).items():
        if key in obj:
            check_value(f"{what}{path}", key, obj[key], kind)
    return obj


# meta.json beside prepared token files (hpcpar data prepare, training/text.py)
META_TYPES = {"vocab_size": "count", "dtype": "text", "train_tokens": "count", "val_tokens": "count",
              "characters": "count", "sources": "list"}


def window_tokens(seq_len):
    """Tokens one training window of ``seq_len`` needs: seq_len inputs and their seq_len targets (the
    inputs shifted by one) take seq_len + 1, and the window must have a start to draw (starts())."""
    return seq_len + 2


def token_meta(path):
    """The meta.json beside a .bin token file (written by ``hpcpar data prepare``), or {}."""
    return read_optional_json(Path(path).parent / "meta.json", types=META_TYPES)


def check_tokens(path, tokens, meta):
    """A token file against its meta.json: as many tokens as it says (``train_tokens`` of train.bin,
    ``val_tokens`` of val.bin), and every id below its vocabulary - an id at or above it would index past
    the embedding (on one tensor-parallel rank only: a wrong result, or an error on one rank)."""
    where = Path(path).parent / "meta.json"
    count = {"train.bin": "train_tokens", "val.bin": "val_tokens"}.get(Path(path).name)
    if count in meta and meta[count] != tokens.size:
        raise UsageError(f"{path} holds {tokens.size} tokens but {where} says {count} = {meta[count]}: a "
                         f"truncated or replaced file (prepare it again)")
    vocab = meta.get("vocab_size")
    if vocab is not None and tokens.size:
        top = int(tokens.max())
        if top >= vocab:
            raise UsageError(f"{path} holds token id {top} but {where} says vocab_size = {vocab}: the ids must "
                             f"be below it (a meta.json of other data?)")


def starts_file(path):
    """Where ``hpcpar data prepare`` records the document starts of a token file: train.starts.npy
    beside train.bin."""
    path = Path(path)
    return path.with_name(path.stem + ".starts.npy")


def read_starts(path, n_tokens):
    """The sorted document starts (int64, first 0) recorded beside the token file ``path``, or [0]:
    one long document (a directory prepared before documents were recorded, a text file)."""
    where = starts_file(path)
    if not where.is_file():
        return np.zeros(1, dtype=np.int64)
    try:
        starts = np.load(where)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read the document starts {where}: {err}") from None
    if starts.ndim != 1 or starts.dtype.kind not in "iu" or not starts.size or starts[0] != 0 \
            or (np.diff(starts) <= 0).any() or starts[-1] >= max(n_tokens, 1):
        raise UsageError(f"{where}: document starts must be increasing token offsets from 0 to below "
                         f"the {n_tokens} tokens of {Path(path).name}")
    return starts.astype(np.int64)


def validation_file(data):
    """val.bin beside the training tokens (``data`` a prepared directory or its train.bin), or None."""
    path = Path(data)
    path = path / "train.bin" if path.is_dir() else path
    val = path.parent / "val.bin"
    return val if path.suffix == ".bin" and val.is_file() else None


class TokenFile:
    """A token stream on disk: char-level text (.txt and anything not .bin), nanoGPT .bin tokens, or the
    train.bin of a prepared directory."""

    def __init__(self, path, seq_len, batch_size, seed=0, order="random", token_dtype="uint16"):
        path = Path(path)
        if path.is_dir():
            path = path / "train.bin"
        if not path.is_file():
            raise UsageError(f"data file {path} not found")
        if order not in ("random", "sequential"):
            raise UsageError(f"--data-order must be random or sequential, not {order!r}")
        if path.suffix == ".bin":
            meta = token_meta(path)
            token_dtype = meta.get("dtype", token_dtype)
            if token_dtype not in ("uint16", "uint32"):
                raise UsageError(f"token files are uint16 or uint32, not {token_dtype!r}")
            itemsize = np.dtype(token_dtype).itemsize
            if path.stat().st_size % itemsize:
                raise UsageError(f"{path}: {path.stat().st_size} bytes is not a whole number of {token_dtype}")
            # an empty file cannot be mapped; it holds 0 tokens, refused below with the others too short
            self.tokens = np.memmap(path, dtype=token_dtype, mode="r") if path.stat().st_size else \
                np.zeros(0, dtype=token_dtype)
            check_tokens(path, self.tokens, meta)
            self.vocab_size = meta.get("vocab_size") or (int(self.tokens.max()) + 1 if self.tokens.size else 0)
            self.chars = None
        else:
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError) as err:
                raise UsageError(f"cannot read {path} as UTF-8 text: {err}") from None
            self.chars = sorted(set(text))
            lookup = {c: i for i, c in enumerate(self.chars)}
            self.tokens = np.array([lookup[c] for c in text], dtype=np.uint32)
            self.vocab_size = len(self.chars)
        if self.tokens.size < window_tokens(seq_len):
            raise UsageError(f"{path} holds {self.tokens.size} tokens; a window of --seq-len {seq_len} needs "
                             f"at least {window_tokens(seq_len)}")
        self.seq_len, self.batch_size, self.seed, self.order = seq_len, batch_size, seed, order
        self.doc_starts = read_starts(path, self.tokens.size) if path.suffix == ".bin" else np.zeros(1, np.int64)
        self.entropy_floor = None

    def starts(self, step, sample_ids):
        span = self.tokens.size - self.seq_len - 1             # last valid window start + 1
        ids = np.asarray(sample_ids)
        if self.order == "sequential":
            return ((step * self.batch_size + ids) * self.seq_len) % span
        return np.random.default_rng([self.seed, step]).integers(0, span, size=self.batch_size)[ids]

    def documents(self, step, sample_ids):
        """(n, T + 1) document ids of the windows' tokens, from the recorded starts."""
        return np.stack([documents_of(self.doc_starts, int(s), self.seq_len + 1) for s in self.starts(step, sample_ids)])

    def batch(self, step, sample_ids):
        T = self.seq_len
        win = np.stack([np.asarray(self.tokens[s:s + T + 1], dtype=np.int64) for s in self.starts(step, sample_ids)])
        return win[:, :-1], win[:, 1:]


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
