"""Exercise 32, a solution: expert parallelism's two all-to-alls."""
import numpy as np


def expert_dispatch(rows, counts, comm):
    p = comm.size
    local = len(counts) // p                               # experts per rank
    send = counts.reshape(p, local).sum(axis=1)            # rows for each rank's experts
    got = comm.all_to_all(counts).reshape(p, local)        # rows each rank has for each of mine
    recv = got.sum(axis=1)
    arrived = comm.all_to_allv(rows, send, recv)           # source by source, expert by expert within
    starts = np.cumsum(got.reshape(-1)) - got.reshape(-1)  # where (source q, my expert j) starts
    order = np.concatenate([np.arange(starts[q * local + j], starts[q * local + j] + got[q, j])
                            for j in range(local) for q in range(p)] + [np.zeros(0, np.int64)])
    offsets = np.concatenate([[0], np.cumsum(got.sum(axis=0))])
    return arrived[order], offsets, (order, send, recv)


def expert_combine(rows, plan, comm):
    order, send, recv = plan
    back = np.empty_like(rows)
    back[order] = rows                                     # source by source again
    return comm.all_to_allv(back, recv, send)
