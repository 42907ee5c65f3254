"""Exercise 31 (docs/course/09-context-parallel.md): ring attention's forward, in the trainer.

Context parallelism gives each of the cp ranks two chunks of every sequence (exercise 17).  Write the
forward of ring attention for one rank: the key/value blocks go round the ring, and this rank's queries
meet each of them once.  `hpcpar train --cp N --plug` puts it in place of the engine's ring
(hpcpar/training/plug.py); the backward stays the engine's, and reads the o and lse you return.

    qs         (B, NH, T/cp, HS) this rank's queries, already scaled by 1 / sqrt(HS)
    k, v       (B, NH, T/cp, HS) this rank's keys and values: its block
    positions  the global positions of every rank's tokens: positions[j] (T/cp,) are rank j's
    comm       a hpcpar Communicator over the cp ranks: comm.isend(array, dest), comm.irecv_(out, source)
               (out a contiguous array: np.empty(shape, dtype)), and wait_all from hpcpar.comm
    attend(qs, k, v, q_positions, k_positions) -> (o_b, lse_b)
               causal attention of the queries over one block: o_b (B, NH, T/cp, HS), lse_b (B, NH, T/cp),
               lse_b = -inf and o_b = 0 for a query that sees none of the block's keys

Return (o, lse) of this rank's queries over every rank's block.  Pass the blocks with messages to
rank + 1 and from rank - 1 only (no collectives), and complete every request.  The check compares with
the engine's ring on 2, 3 and 4 MPI ranks, then trains the tiny GPT at cp 2 and cp 4 with your forward:
every step's loss and gradient norm must be one rank's, in float64.

Check: .venv/bin/hpcpar course check 31            (it starts mpiexec -n 4)
"""
import numpy as np  # noqa: F401

from hpcpar.comm import wait_all  # noqa: F401


def ring_attention_forward(qs, k, v, positions, comm, attend):
    raise NotImplementedError
