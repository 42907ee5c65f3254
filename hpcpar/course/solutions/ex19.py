"""Exercise 19, a solution: the K/V head of each query head of a tensor-parallel rank."""


def kv_heads(n_head, n_kv_head, tp, rank):
    per_rank, group = n_head // tp, n_head // n_kv_head
    return [(rank * per_rank + i) // group for i in range(per_rank)]
