"""Exercise 7 (docs/course/05-data-parallel.md): the slice of a bucket ZeRO-1 gives each rank.

With ZeRO-1 each of the dp ranks keeps the optimizer state of, and updates, only one slice of every
flat gradient bucket of `size` numbers (size is padded to a multiple of dp); an all-gather then puts
the updated slices back together in rank order.  Return the half-open range [lo, hi) of rank `rank`.

Check: .venv/bin/hpcpar course check 7
"""


def zero1_shard(size, dp, rank):
    """(lo, hi)"""
    raise NotImplementedError
