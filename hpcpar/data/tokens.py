"""A token stream on disk: a text file, a .bin token file, or a directory from ``hpcpar data prepare``
(train.bin, val.bin, meta.json, the document starts); read through np.memmap, checked against its
meta.json (hpcpar/data/__init__.py: the order of its windows).
"""
from pathlib import Path

import numpy as np

from hpcpar.data.values import read_optional_json
from hpcpar.ops.masks import documents_of
from hpcpar.runtime import UsageError


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
