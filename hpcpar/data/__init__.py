"""Training data, with a batch order fixed by (seed, step) alone (synthetic.py, tokens.py; the kinds of a
JSON file's values, values.py).

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
from hpcpar.data.synthetic import MarkovLanguage, Regression
from hpcpar.data.tokens import TokenFile, validation_file

__all__ = ["MarkovLanguage", "Regression", "TokenFile", "validation_file"]
