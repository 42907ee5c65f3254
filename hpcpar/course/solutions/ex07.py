"""Exercise 7, a solution: ZeRO-1's slice of a padded bucket."""


def zero1_shard(numel, dp, rank):
    k = -(-numel // dp)                  # ceil: the bucket is padded to dp k numbers
    return rank * k, (rank + 1) * k
