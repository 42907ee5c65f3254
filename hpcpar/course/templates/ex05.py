"""Exercise 5 (docs/course/04-pipeline.md): predict, then measure.

4 pipeline stages, 4 micro-batches, forwards only, each forward one time unit on each stage.  How many
device time units are busy, out of how many in total (every device counted from the step's start to
its end)?

Check: .venv/bin/hpcpar course check 5          (the command that measures it comes with a passed check)
"""

ANSWER = None      # (busy units, total units), e.g. (10, 20)
