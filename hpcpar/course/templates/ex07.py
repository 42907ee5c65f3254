"""Exercise 7 (docs/course/05-data-parallel.md): the slice of a bucket ZeRO-1 gives each rank.

With ZeRO-1 each of the dp ranks keeps the optimizer state of, and updates, only one slice of every
flat gradient bucket; an all-gather then puts the updated slices back together in rank order.  A
bucket holds `numel` gradient numbers, and is padded with zeros so that it cuts into dp slices of
equal length.  Return the half-open range [lo, hi) of rank `rank` in the padded bucket.

The check compares your ranges with the engine's, then trains the tiny GPT with --zero 1 at dp 2, 3 and
4 with your ranges in place of the engine's (float64: every loss must be one rank's).  Try it yourself:

    .venv/bin/mpiexec -n 2 .venv/bin/hpcpar train --dp 2 --zero 1 --plug course-work/ex07.py

Check: .venv/bin/hpcpar course check 7           (it starts mpiexec -n 4)
"""


def zero1_shard(numel, dp, rank):
    """(lo, hi)"""
    raise NotImplementedError
