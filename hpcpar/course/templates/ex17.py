"""Exercise 17 (docs/course/09-context-parallel.md): which key/value block rank r holds at ring step s.

Context parallelism cuts a sequence of `seq_len` tokens over cp ranks.  For causal balance the sequence
is cut into 2 cp equal chunks and rank j holds chunks j and 2 cp - 1 - j (one early, one late).  In
ring attention the key/value blocks travel round the ring: at step 0 each rank has its own; at each
step every rank passes the block it has to rank + 1 (mod cp).

Return the global positions (increasing) of the key/value block rank `rank` holds at step `step`.

Check: .venv/bin/hpcpar course check 17
"""


def kv_positions(rank, step, cp, seq_len):
    raise NotImplementedError
