"""Communication time: the alpha-beta model per link class, placed on the real rank order.

A message of n bytes over a link costs alpha + n / beta.  Ring collectives over a group of N ranks
(Patarasuk and Yuan 2009; docs/design.md, Ring collectives) move, per rank:

    all-reduce        2 (N-1)/N * n bytes in 2 (N-1) steps
    reduce-scatter      (N-1)/N * n bytes in   (N-1) steps      (all-gather the same)

so time = steps * alpha + bytes / beta.  Which link a group uses follows from the rank order
``rank = tp + TP*(cp + CP*(dp + DP*pp))`` (hpcpar/comm/grid.py's tp-dp-pp order, with context parallelism
next to tensor parallelism as in Megatron-Core): a group whose members share one node talks over
NVLink; one that spans nodes goes through the network, and when k of its members share a node the k
rings that leave that node use k network ports at once, so beta = min(NVLink, k * port).  ZeRO and
the gradient reduction run over the "shard" group: the dp * cp ranks that hold the same weights - or,
under HSDP, a shard group of dp-shard * cp of them, tp apart (inside a node when it fits), after which
each owned range, 1/shard of the gradients, is all-reduced over the "across" group (tp * shard apart,
across the nodes): reduce-scatter + all-reduce of n / shard instead of one reduce-scatter over all.
Context parallelism passes K and V chunks round a ring (cp_ring_seconds), all-gathers them
(cp_allgather_seconds), or trades the sequence cut for a head cut by all-to-alls (Ulysses,
cp_all_to_all_seconds).  An all-to-all over N ranks hands each of the N-1 others one block of
n / N bytes, so per rank

    all-to-all          (N-1)/N * n bytes in   (N-1) steps      (pairwise exchange)

the bytes of a reduce-scatter - on the same link - without its additions.  Expert parallelism's
all-to-alls (dispatch and combine, ep_all_to_all_seconds) run over ep consecutive ranks of dp * cp
(tp apart); of a rank's n bytes, n / ep stay on the rank, (k - 1) n / ep go to the k - 1 other members
on its node over NVLink and (ep - k) n / ep leave the node through the rank's own network port, both
at once, so

    ep all-to-all       (ep - 1) alpha + max((k - 1)/ep * n / NVLink, (ep - k)/ep * n / port)

(alpha the network's once the group leaves the node).  Expert gradients are summed over the
"expert-data" group: the (dp * cp) / ep ranks holding the same experts, tp * ep apart.
"""
from hpcpar.tools.plan.flops import kv_heads_per_rank
from hpcpar.tools.plan.hardware import Link


def members_per_node(layout, axis, gpus_per_node):
    """(group size, members of rank 0's group on rank 0's node) for the group along ``axis``: the
    members are ``stride`` ranks apart, so ceil(gpus_per_node / stride) of them share node 0."""
    tp, cp, dp = layout.tp, layout.cp, layout.dp
    expert_across = layout.replicas // layout.ep // layout.expert_shard
    size, stride = {"tp": (tp, 1), "cp": (cp, tp), "dp": (dp, tp * cp), "shard": (layout.shard, tp),
                    "across": (layout.across, tp * layout.shard),
                    "pp": (layout.pp, tp * cp * dp), "ep": (layout.ep, tp),
                    "expert-data": (layout.expert_shard, tp * layout.ep),
                    "expert-across": (expert_across, tp * layout.ep * layout.expert_shard)}[axis]
    return size, min(size, -(-gpus_per_node // stride))


def group_link(hardware, layout, axis, gpus_per_node):
    """The effective link (alpha, beta) of the ``axis`` group under the layout's rank order."""
    size, local = members_per_node(layout, axis, gpus_per_node)
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


def all_to_all_seconds(link, size, nbytes):
    """An all-to-all of ``nbytes`` per rank (its own block included) over ``size`` ranks on ``link``."""
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


def shard_seconds(job, layout, nbytes):
    """One reduce-scatter (or all-gather) of ``nbytes`` over the ranks ZeRO shards over (module docstring)."""
    link = group_link(job.hardware, layout, "shard", job.gpus_per_node)
    return reduce_scatter_seconds(link, layout.shard, nbytes)


def across_seconds(job, layout, nbytes, groups=("shard", "across")):
    """HSDP: the all-reduce of each owned range of ``nbytes`` of gradients (nbytes / shard of them) over
    the groups across (0 without HSDP); ``groups``: the experts' ("expert-data", "expert-across")."""
    size, _ = members_per_node(layout, groups[1], job.gpus_per_node)
    inside, _ = members_per_node(layout, groups[0], job.gpus_per_node)
    link = group_link(job.hardware, layout, groups[1], job.gpus_per_node)
    return all_reduce_seconds(link, size, nbytes / inside)


def dp_gradient_seconds(job, layout, nbytes):
    """(reduce-scatter part, all-gather part) of averaging ``nbytes`` of gradients over DP (x CP).

    A plain all-reduce is a reduce-scatter followed by an all-gather; ZeRO-1 does the same two halves
    with the optimizer step in between (gradients scattered, updated parameters gathered).  Under HSDP
    the reduce-scatter inside the shard group is followed by the all-reduce across the groups."""
    half = shard_seconds(job, layout, nbytes)
    return half + across_seconds(job, layout, nbytes), half


def cp_chunk_bytes(job, layout):
    """One K and V chunk a rank passes on: 2 * (kv heads / t) * d * (s / cp) * b elements."""
    m = job.model
    return 2 * kv_heads_per_rank(m, layout.tp) * m.head_dim * (job.seq_len // layout.cp) * layout.mb * job.elem_bytes


def cp_ring_crosses_nodes(job, layout):
    """Whether the cp ring leaves the node: its members are tp ranks apart, so cp * tp > GPUs per node."""
    size, local = members_per_node(layout, "cp", job.gpus_per_node)
    return local < size


def cp_ring_seconds(job, layout):
    """Forward ring-attention traffic of one layer and micro-batch: cp - 1 hops of a K and V chunk,
    all hops at once, so each step waits for the slowest: once the ring leaves the node, the hop that
    crosses it goes through the sender's one network port (one ring, unlike a collective's k rings)."""
    if layout.cp == 1:
        return 0.0
    hw = job.hardware
    link = hw.inter if cp_ring_crosses_nodes(job, layout) else hw.intra
    return (layout.cp - 1) * link.seconds(cp_chunk_bytes(job, layout))


def cp_allgather_seconds(job, layout):
    """One all-gather of every rank's K and V chunk over the cp group - context parallelism that gathers
    K and V whole before the attention core instead of passing chunks round a ring (``engine.cp_allgather``):
    a collective on the cp group's link, like the other collectives (k members on a node, k ports)."""
    link = group_link(job.hardware, layout, "cp", job.gpus_per_node)
    # A ring all-gather is a ring reduce-scatter run backwards: cp - 1 steps, each passing one chunk
    # to the next rank (without the addition), so the same latency and bytes: (cp - 1) / cp of the total.
    return reduce_scatter_seconds(link, layout.cp, layout.cp * cp_chunk_bytes(job, layout))


def ulysses_message_bytes(job, layout):
    """(Q, K, V message, O message) of one Ulysses layer and micro-batch on a rank: b (s/cp) d x the heads
    a tp rank moves, (a + 2 kv) / t and a / t (context_parallel/ulysses.py sends exactly these)."""
    m = job.model
    token_head = layout.mb * (job.seq_len // layout.cp) * m.head_dim * job.elem_bytes
    heads = m.heads // layout.tp
    return token_head * (heads + 2 * kv_heads_per_rank(m, layout.tp)), token_head * heads


def cp_all_to_all_seconds(job, layout):
    """Ulysses' forward of one layer and micro-batch: the Q, K, V all-to-all and the O all-to-all over the
    cp group's link (the backward moves the same bytes: dO, then dQ, dK, dV).  Nothing overlaps them:
    the attention core waits for its heads, the output projection for its tokens."""
    link = group_link(job.hardware, layout, "cp", job.gpus_per_node)
    return sum(all_to_all_seconds(link, layout.cp, n) for n in ulysses_message_bytes(job, layout))


def ep_all_to_all_seconds(job, layout, nbytes):
    """One all-to-all of expert parallelism (dispatch or combine) of ``nbytes`` per rank, its own rows
    included, over the ep group as it lands on nodes (module docstring): the NVLink and the network
    parts run at once, each at its own link's rate."""
    ep = layout.ep
    if ep == 1 or nbytes == 0:
        return 0.0
    _, local = members_per_node(layout, "ep", job.gpus_per_node)
    intra, inter = job.hardware.intra, job.hardware.inter
    inside = (local - 1) / ep * nbytes / (intra.bandwidth * intra.efficiency)
    leaving = (ep - local) / ep * nbytes / (inter.bandwidth * inter.efficiency)
    latency = intra.latency if local == ep else inter.latency
    return (ep - 1) * latency + max(inside, leaving)


def expert_data_seconds(job, layout, nbytes):
    """One reduce-scatter (or all-gather) of ``nbytes`` of expert gradients over the ranks their state is
    sharded over: the expert-data group (under HSDP its part in a shard group)."""
    link = group_link(job.hardware, layout, "expert-data", job.gpus_per_node)
    return reduce_scatter_seconds(link, layout.expert_shard, nbytes)
