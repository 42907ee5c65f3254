"""Communication time: the alpha-beta model per link class, placed on the real rank order.

A message of n bytes over a link costs alpha + n / beta.  Ring collectives over a group of N ranks
(Patarasuk and Yuan 2009; docs/design.md, Ring collectives) move, per rank:

    all-reduce        2 (N-1)/N * n bytes in 2 (N-1) steps
    reduce-scatter      (N-1)/N * n bytes in   (N-1) steps      (all-gather the same)

so time = steps * alpha + bytes / beta.  Which link a group uses follows from the rank order
``rank = tp + TP*(dp + DP*pp)`` (hpcpar/grid.py): a group whose members share one node talks over
NVLink; one that spans nodes goes through the network, and when k of its members share a node the k
rings that leave that node use k network ports at once, so beta = min(NVLink, k * port).
"""
from functools import lru_cache

from hpcpar.grid import GridLayout
from hpcpar.plan.hardware import Link


@lru_cache(maxsize=None)
def members_per_node(tp, pp, dp, axis, gpus_per_node):
    """(group size, members of rank 0's group on rank 0's node) for the group along ``axis``."""
    grid = GridLayout(tp, pp, dp, tp * pp * dp)
    group = grid.group(0, axis)
    return len(group), sum(1 for r in group if r // gpus_per_node == 0)


def group_link(hardware, layout, axis, gpus_per_node):
    """The effective link (alpha, beta) of the ``axis`` group under the layout's rank order."""
    size, local = members_per_node(layout.tp, layout.pp, layout.dp, axis, gpus_per_node)
    intra, inter = hardware.intra, hardware.inter
    if local == size:
        return intra
    beta = min(intra.bandwidth * intra.efficiency, local * inter.bandwidth * inter.efficiency)
    return Link(bandwidth=beta, latency=inter.latency, efficiency=1.0)


def all_reduce_seconds(link, size, nbytes):
    if size == 1 or nbytes == 0:
        return 0.0
    return 2 * (size - 1) * link.latency + 2 * (size - 1) / size * nbytes / (link.bandwidth * link.efficiency)


def reduce_scatter_seconds(link, size, nbytes):
    """Also the time of an all-gather that produces ``nbytes`` in total."""
    if size == 1 or nbytes == 0:
        return 0.0
    return (size - 1) * link.latency + (size - 1) / size * nbytes / (link.bandwidth * link.efficiency)


def tp_all_reduce(job, layout, nbytes):
    link = group_link(job.hardware, layout, "tp", job.gpus_per_node)
    return all_reduce_seconds(link, layout.tp, nbytes)


def p2p_seconds(job, layout, nbytes):
    """One activation (or its gradient) from a stage to the next: pipeline neighbours are TP*DP ranks
    apart, so whenever the job spans nodes the slowest hop crosses the network."""
    if layout.pp == 1:
        return 0.0
    link = job.hardware.intra if job.gpus <= job.gpus_per_node else job.hardware.inter
    return link.seconds(nbytes)


def dp_gradient_seconds(job, layout, nbytes):
    """(reduce-scatter part, all-gather part) of averaging ``nbytes`` of gradients over DP.

    A plain all-reduce is a reduce-scatter followed by an all-gather; ZeRO-1 does the same two halves
    with the optimizer step in between (gradients scattered, updated parameters gathered)."""
    link = group_link(job.hardware, layout, "dp", job.gpus_per_node)
    half = reduce_scatter_seconds(link, layout.dp, nbytes)
    return half, half
