"""Exercise 32 (docs/course/16-all-to-all.md): the experts' all-to-alls, in the trainer.

Expert parallelism spreads each MoE layer's E experts over the ep ranks of a group, E/ep consecutive
experts each.  A rank's routed rows arrive sorted by expert; `counts` (E,) says how many rows it has for
each expert.  Write the two exchanges that `hpcpar train --ep N --plug` puts in place of the engine's
(hpcpar/training/plug.py); the backward sends the gradients through the same two functions.

    expert_dispatch(rows, counts, comm) -> (xe, local_offsets, plan)
        rows (M, C) this rank's rows, expert by expert; comm a hpcpar Communicator over the ep ranks
        xe: every row of the group for this rank's experts, expert by expert, and within one expert
            source rank by source rank; local_offsets: E/ep + 1 offsets, expert j's rows are
            xe[local_offsets[j]:local_offsets[j + 1]]; plan: anything the combine needs
    expert_combine(rows, plan, comm) -> (M, C)
        the experts' outputs, in xe's order -> each back on the rank it came from, in its first order

comm.all_to_all(a) sends block j of a (ep equal blocks along axis 0) to rank j;
comm.all_to_allv(x, send_counts, recv_counts) sends send_counts[j] consecutive rows of x to rank j
and returns the rows from rank 0, then rank 1, ...  The check compares with the engine's dispatch on
2, 3 and 4 MPI ranks, then trains moe-tiny at ep 2 and ep 4: every step's loss and gradient norm must
be one rank's, in float64.

Check: .venv/bin/hpcpar course check 32            (it starts mpiexec -n 4)
"""
import numpy as np  # noqa: F401


def expert_dispatch(rows, counts, comm):
    raise NotImplementedError


def expert_combine(rows, plan, comm):
    raise NotImplementedError
