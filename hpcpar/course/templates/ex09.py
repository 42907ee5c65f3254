"""Exercise 9 (docs/course/06-3d.md): predict, then measure.

A job of tp 2 x pp 4 x dp 2 = 16 ranks on two nodes of 8 (consecutive ranks on one node), in the
default rank order (tp-dp-pp).  Of the 12 stage-to-stage hops of the pipelines (each pipeline rank
sending to its next stage), how many cross from one node to the other?

Check: .venv/bin/hpcpar course check 9          (the command that measures it comes with a passed check)
"""

ANSWER = None      # a number of hops
