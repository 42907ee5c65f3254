"""Exercise 9 (docs/course/06-3d.md): predict, then measure.

A job of tp 4 x pp 2 x dp 2 = 16 ranks on two nodes of 8 (consecutive ranks on one node), in the
default rank order.  Of the 8 stage-to-stage hops of the pipelines (each pipeline rank sending to its
next stage), how many cross from one node to the other?

Check: .venv/bin/hpcpar course check 9
Measure: .venv/bin/hpcpar grid --tp 4 --pp 2 --dp 2 --world 16 --ranks-per-node 8
"""

ANSWER = None      # a number of hops
