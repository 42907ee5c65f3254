"""Exercise 17, a solution: the key/value positions at ring step s."""


def kv_positions(rank, step, cp, seq_len):
    j = (rank - step) % cp
    c = seq_len // (2 * cp)
    return list(range(j * c, (j + 1) * c)) + list(range((2 * cp - 1 - j) * c, (2 * cp - j) * c))
