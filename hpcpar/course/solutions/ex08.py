"""Exercise 8, a solution: a rank's coordinates in the order tp-dp-pp."""


def coords(rank, tp, pp, dp):
    return rank % tp, rank // (tp * dp), (rank // tp) % dp
