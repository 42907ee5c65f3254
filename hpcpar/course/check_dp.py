"""Data-parallel exercises: the ring all-reduce, and the slice of a bucket ZeRO-1 gives each rank."""
from types import SimpleNamespace

import numpy as np

from hpcpar.buckets import Bucket
from hpcpar.course.exercise import Wrong


def check_ring_allreduce(f):
    for p, n in ((4, 8), (3, 6), (2, 2), (5, 20)):
        rng = np.random.default_rng(p)
        xs = [rng.standard_normal(n) for _ in range(p)]
        sent = []
        out = f([x.copy() for x in xs], lambda src, dst, chunk: sent.append((src, dst, np.size(chunk))))
        want = sum(xs)
        for r, y in enumerate(out):
            if np.shape(y) != (n,) or not np.allclose(y, want, rtol=1e-12, atol=1e-12):
                raise Wrong(f"{p} ranks: rank {r} ends with {np.round(y, 3)}, not the sum {np.round(want, 3)}")
        for src, dst, size in sent:
            if dst != (src + 1) % p:
                raise Wrong(f"{p} ranks: rank {src} sent to rank {dst}; a ring sends only to rank + 1 (mod p)")
            if size != n // p:
                raise Wrong(f"{p} ranks: a message of {size} numbers; the ring moves chunks of n/p = {n // p}")
        if len(sent) != 2 * (p - 1) * p:
            raise Wrong(f"{p} ranks: {len(sent)} messages; a ring all-reduce takes 2 (p - 1) steps of p "
                        f"messages = {2 * (p - 1) * p} (reduce-scatter, then all-gather)")


def zero1_shard(size, dp, rank):
    """Reference: the [lo, hi) of a flat bucket that ``rank`` of ``dp`` updates under ZeRO-1."""
    return Bucket.zero_range(SimpleNamespace(size=size), rank, dp)     # a bucket's size is all the rule needs


def check_zero1_shard(f):
    for size, dp in ((12, 4), (8, 2), (30, 3), (7, 1)):      # buckets are padded to a multiple of dp
        got = [tuple(f(size, dp, r)) for r in range(dp)]
        want = [zero1_shard(size, dp, r) for r in range(dp)]
        if got != want:
            covered = sorted(i for lo, hi in got for i in range(lo, hi))
            if covered != list(range(size)):
                raise Wrong(f"size {size}, dp {dp}: the slices {got} do not cover every element exactly once")
            raise Wrong(f"size {size}, dp {dp}: slices {got}, expected {want} (rank r takes the r-th of dp "
                        "equal, consecutive slices: the all-gather puts them back in rank order)")
