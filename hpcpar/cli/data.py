"""Prepare real text for training: byte-level BPE tokens in nanoGPT's .bin layout (no MPI needed).

  hpcpar data prepare book.txt -o data/book --vocab 2048                 train a tokenizer on the text
  hpcpar data prepare a.txt b.txt -o data/ab --tokenizer tokenizer.json  use a tokenizer you have
  hpcpar data prepare a.txt -o data/a --tokenizer vocab.json --merges merges.txt   (GPT-2's files)

The directory then holds train.bin, val.bin, where each document starts (train.starts.npy, val.starts.npy;
--separator splits a file into documents), tokenizer.json and meta.json; train on it with
`hpcpar train --data DIR --eval-every N` (--documents: attention within each document), and sample with
`hpcpar generate`.
"""
from hpcpar.cli import finite

HELP = "prepare text for training (BPE tokenizer, train.bin / val.bin)"


def add_arguments(p):
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    q = sub.add_parser("prepare", help="tokenize text files into train.bin / val.bin with a byte-level BPE")
    q.add_argument("texts", nargs="+", metavar="TEXT", help="UTF-8 text files")
    q.add_argument("-o", "--out", required=True, help="output directory")
    q.add_argument("--vocab", type=int, default=2048, help="vocabulary of the tokenizer trained on the text "
                                                           "(default: 2048)")
    q.add_argument("--tokenizer", default=None, help="use this tokenizer.json (or GPT-2 vocab.json) instead")
    q.add_argument("--merges", default=None, help="GPT-2's merges.txt, with --tokenizer vocab.json")
    q.add_argument("--val-fraction", type=finite, default=0.1, help="share of the tokens kept for validation "
                                                                   "(default: 0.1)")
    q.add_argument("--seq-len", type=int, default=None, help="refuse text too short for one training window of "
                                                             "this length (default: the tiny model's)")
    q.add_argument("--separator", default=None, help="split each text into documents at this string (e.g. "
                                                     "'\\n\\n\\n' or '<|endoftext|>'); default: each file is one "
                                                     "document")
    q.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def _escapes(separator):
    """\\n and \\t typed on a command line as the newline and tab they stand for."""
    return separator and separator.replace("\\n", "\n").replace("\\t", "\t")


def run(args):
    from hpcpar.training.config import DEFAULT_MODEL
    from hpcpar.nn.gpt import PRESETS
    from hpcpar.training.text import describe, prepare
    seq_len = args.seq_len or PRESETS[DEFAULT_MODEL].seq_len
    meta = prepare(args.texts, args.out, args.vocab, args.tokenizer, args.merges, args.val_fraction, args.progress,
                   seq_len, _escapes(args.separator))
    print(f"{args.out}: {describe(meta)}")
    return 0
