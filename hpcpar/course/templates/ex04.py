"""Exercise 4 (docs/course/03-tensor-parallel.md): predict, then measure.

`.venv/bin/mpiexec -n 2 .venv/bin/hpcpar train --tp 2 --dtype float64` trains the tiny GPT (2 blocks,
d_model 64) on batches of 32 sequences of 64 tokens, with one micro-batch.  How many MiB of
activations does one rank hand to all-reduces in one step (forward and backward), leaving out the
loss's two tiny all-reduces?  One activation is b x s x h float64 numbers.

Check: .venv/bin/hpcpar course check 4          (the command that measures it comes with a passed check)
"""

ANSWER = None      # MiB, e.g. 3.5
