"""Exercise 28 (docs/course/16-all-to-all.md): predict, then measure.

`.venv/bin/mpiexec -n 4 .venv/bin/hpcpar train --model mixtral-tiny --dp 4 --ep EP --dtype float64
--batch-size 16` trains the tiny Mixtral (2 blocks, d_model 64, sequences of 64 tokens, each MoE layer
4 experts of which every token takes the top 2) on batches of 16 sequences, with one micro-batch,
its experts spread over EP ranks.  How many bytes does one rank hand MPI in one step for the rows of
the expert-parallel all-to-alls - the dispatch and the combine, forward and backward, of every MoE
layer, the rows to itself included - at EP 2, and at EP 4?  Leave out the small all-to-all of the
experts' counts.  Routing is as the router decides, not necessarily balanced.

Check: .venv/bin/hpcpar course check 28          (the command that measures it comes with a passed check)
"""

ANSWER = None      # (bytes at ep 2, bytes at ep 4), e.g. (1000, 500)
