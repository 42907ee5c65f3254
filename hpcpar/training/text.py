"""Real text as tokens: a byte-level BPE tokenizer (the ``tokenizers`` library) and ``hpcpar data prepare``.

Byte-level BPE, GPT-2's tokenizer: the text is read as UTF-8 bytes, each byte a symbol, so no input is
ever unknown; training merges the most frequent adjacent pair of symbols into a new one, again and
again, until the vocabulary has the size asked for.  Frequent words become one token, rare ones a few.

    prepare(texts, out, vocab_size=2048)                 train a tokenizer on the text itself
    prepare(texts, out, tokenizer="tokenizer.json")      or use one the user has (tokenizer.json, or
    prepare(texts, out, tokenizer="vocab.json", merges="merges.txt")   GPT-2's two files)

writes  out/train.bin, out/val.bin   token ids in nanoGPT's layout: uint16 when the vocabulary fits, else uint32
        out/train.starts.npy, out/val.starts.npy   where each document starts (int64 token offsets)
        out/tokenizer.json           the tokenizer, to decode what the model writes (hpcpar generate)
        out/meta.json                vocabulary size, dtype, token and document counts (read by the training data)

Each file is a document - or, with ``separator``, each piece of it between separators (a file of many
stories, say, split at blank lines with "\n\n\n") - and each document ends with GPT-2's end-of-text
token; the next one starts after it (``hpcpar train --documents`` masks attention there and restarts
positions, ops/masks.py).  The last ``val_fraction`` of the token stream is the validation set: its
first piece counts as a document of its own.
"""
import re
from pathlib import Path

import numpy as np

from hpcpar.checkpoint.files import write_atomic, write_json
from hpcpar.data.tokens import starts_file, window_tokens
from hpcpar.runtime import UsageError

EOT = "<|endoftext|>"
TOKENIZER = "tokenizer.json"
CHUNK = 1 << 20               # characters encoded at a time (the progress bar's step)
_LINE_START = re.compile(r"\n(?=\S)")


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise UsageError("hpcpar data prepare needs the tokenizers library: pip install tokenizers") from None
    return tokenizers


def train_tokenizer(texts, vocab_size):
    """A byte-level BPE tokenizer of ``vocab_size`` tokens trained on the strings ``texts``."""
    tk = _tokenizers()
    if vocab_size < 257:
        raise UsageError(f"--vocab {vocab_size}: a byte-level BPE needs at least 257 tokens (256 bytes + {EOT})")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def load_tokenizer(path, merges=None):
    """A tokenizer.json, or GPT-2's vocab.json + merges.txt."""
    tk = _tokenizers()
    try:
        if merges:
            tok = tk.Tokenizer(tk.models.BPE.from_file(str(path), str(merges)))
            tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = tk.decoders.ByteLevel()
            return tok
        return tk.Tokenizer.from_file(str(path))
    except Exception as err:                       # the library raises its own error types
        raise UsageError(f"cannot load the tokenizer {path}: {err}") from None


def model_tokenizer(path, vocab_size, what):
    """The tokenizer at ``path``, refused in one line when it cannot load or has more tokens than the
    model's ``vocab_size`` rows (it is another model's: its ids past the vocabulary have no embedding);
    ``what`` names the option it came from."""
    tok = load_tokenizer(path)
    if tok.get_vocab_size() > vocab_size:
        raise UsageError(f"{what}: the tokenizer {path} has {tok.get_vocab_size()} tokens but the model's vocabulary "
                         f"is {vocab_size}: it is not this model's tokenizer")
    return tok


def tokenizer_of(data):
    """The tokenizer.json of a prepared data directory (``data`` the directory or a file in it), or None."""
    path = Path(data)
    if not path.exists():
        return None
    path = path if path.is_dir() else path.parent
    return path / TOKENIZER if (path / TOKENIZER).is_file() else None


def _chunks(text):
    """Pieces of about CHUNK characters, cut after a newline that a non-space follows: the byte-level
    pre-tokenizer cuts there too, so encoding the pieces gives the tokens of the whole."""
    start = 0
    while start < len(text):
        cut = _LINE_START.search(text, min(start + CHUNK, len(text)))
        end = cut.end() if cut else len(text)
        yield text[start:end]
        start = end


def encode(tok, texts, progress=True, starts=None):
    """Token ids of the texts, an end-of-text token after each; a progress bar on big inputs.
    ``starts``: a list that receives the offset of each text's first token."""
    from tqdm import tqdm
    eot = tok.token_to_id(EOT)
    total = sum(len(t) for t in texts)
    ids = []
    with tqdm(total=total, unit="char", unit_scale=True, desc="tokenize", disable=not progress or total < 8 * CHUNK,
              mininterval=0.5) as bar:
        for text in texts:
            if starts is not None:
                starts.append(len(ids))
            for piece in _chunks(text):
                ids.extend(tok.encode(piece).ids)
                bar.update(len(piece))
            if eot is not None:
                ids.append(eot)
    return ids


def documents(texts, separator=None):
    """The documents of the texts: each text, or its pieces between ``separator``s (empty ones dropped)."""
    if not separator:
        return list(texts)
    return [piece for text in texts for piece in text.split(separator) if piece]


def split_starts(starts, n_train):
    """Document starts of the whole stream -> those of train.bin and val.bin (val.bin's from its first
    token, which starts a document of its own)."""
    starts = np.asarray(starts, dtype=np.int64)
    val = starts[starts > n_train] - n_train
    return starts[starts < n_train], np.concatenate([[0], val]).astype(np.int64)


def prepare(paths, out, vocab_size=2048, tokenizer=None, merges=None, val_fraction=0.1, progress=True,
            seq_len=None, separator=None):
    """Tokenize the text files ``paths`` into ``out`` (see the module docstring). Returns meta.json's dict.
    With ``seq_len``, refuses text whose training part cannot hold one window of that length."""
    texts = []
    for p in paths:
        try:
            texts.append(Path(p).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"cannot read {p} as UTF-8 text: {err}") from None
    if not 0 < val_fraction < 1:
        raise UsageError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    if not any(texts):                     # nothing to train a tokenizer on, nor to train a model on
        _too_short(paths, 0, seq_len or 0)
    tok = load_tokenizer(tokenizer, merges) if tokenizer else train_tokenizer(texts, vocab_size)
    docs, starts = documents(texts, separator), []
    if not docs:
        _too_short(paths, 0, seq_len or 0)
    ids = np.asarray(encode(tok, docs, progress, starts), dtype=np.int64)
    V = tok.get_vocab_size()
    dtype = np.uint16 if V <= 1 << 16 else np.uint32
    n_val = max(1, int(len(ids) * val_fraction))
    if seq_len and len(ids) - n_val < window_tokens(seq_len):
        _too_short(paths, len(ids) - n_val, seq_len)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "train.bin", ids[:-n_val].astype(dtype).tobytes())
    write_atomic(out / "val.bin", ids[-n_val:].astype(dtype).tobytes())
    train_starts, val_starts = split_starts(starts, len(ids) - n_val)
    for name, array in (("train", train_starts), ("val", val_starts)):
        write_atomic(starts_file(out / f"{name}.bin"), _npy(array))
    write_atomic(out / TOKENIZER, tok.to_str().encode())
    meta = {"vocab_size": V, "dtype": np.dtype(dtype).name, "train_tokens": len(ids) - n_val, "val_tokens": n_val,
            "sources": [str(p) for p in paths], "characters": sum(len(t) for t in texts),
            "documents": {"train": len(train_starts), "val": len(val_starts)}, "separator": separator,
            "eot": tok.token_to_id(EOT)}
    write_json(out / "meta.json", meta)
    return meta


def _npy(array):
    """The bytes of ``array`` as a .npy file."""
    import io
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _too_short(paths, n_train, seq_len):
    names = " ".join(str(p) for p in paths)
    raise UsageError(f"{names}: {n_train:,} training tokens, too short for one training window: --seq-len "
                     f"{seq_len} needs at least {window_tokens(seq_len):,}")


def decoder(path):
    """ids -> text with the tokenizer.json at ``path``."""
    tok = load_tokenizer(path)
    return lambda ids: tok.decode([int(i) for i in ids], skip_special_tokens=False)


def describe(meta):
    return (f"{meta['characters']:,} characters -> {meta['train_tokens']:,} training and {meta['val_tokens']:,} "
            f"validation tokens ({meta['characters'] / max(1, meta['train_tokens'] + meta['val_tokens']):.2f} "
            f"characters per token), vocabulary {meta['vocab_size']:,}, {meta['dtype']}, "
            f"{meta['documents']['train']:,} training document{'s' if meta['documents']['train'] != 1 else ''}")

