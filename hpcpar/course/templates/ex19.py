"""Exercise 19 (docs/course/10-llama.md): grouped-query attention's head map under tensor parallelism.

Llama's attention has n_head query heads and n_kv_head <= n_head key/value heads; query head g attends
with the K/V head of its group (n_head / n_kv_head consecutive query heads share one).  Tensor
parallelism over tp ranks cuts the Q projection and the K/V projections by heads.

Return, for each query head rank `rank` holds (in the rank's order), the global index of the K/V head
it attends with.

Check: .venv/bin/hpcpar course check 19
"""


def kv_heads(n_head, n_kv_head, tp, rank):
    raise NotImplementedError
