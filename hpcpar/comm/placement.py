"""Which link each group of a grid crosses, once its ranks are placed on nodes.

Launchers (mpiexec, srun) put consecutive ranks on one node: node = rank // ranks_per_node.  A group
whose ranks share a node talks over the fast links inside it (NVLink, shared memory); a group that
spans nodes goes through the network, one to two orders of magnitude slower per GPU.  With the
rank order tp-dp-pp (TP fastest), TP groups stay inside a node as long as tp <= ranks per node;
the pipeline's neighbours are the furthest apart and cross first.

That is the plan; ``describe_boundary`` checks it at the end of a run, from the host each rank reports
and the bytes each of its communicators moved (hpcpar train's summary, on more than one host).
"""
from hpcpar.runtime import UsageError

WHAT = {"tp": "all-reduces inside every layer", "cp": "key/value blocks round the ring in every attention layer",
        "pp": "activations and gradients between stages",
        "dp": "the gradient all-reduce, once per step"}


def node_of(rank, ranks_per_node):
    return rank // ranks_per_node


def link(group, ranks_per_node):
    """"intra-node" when every rank of ``group`` sits on one node, else "inter-node"."""
    return "intra-node" if len({node_of(r, ranks_per_node) for r in group}) == 1 else "inter-node"


def pipeline_hops(layout, ranks_per_node):
    """(hops that cross nodes, all hops) between consecutive pipeline stages."""
    hops = [(r, nxt) for r in range(layout.world) for nxt in [layout.pipeline_neighbours(r)[1]] if nxt is not None]
    crossing = [h for h in hops if node_of(h[0], ranks_per_node) != node_of(h[1], ranks_per_node)]
    return len(crossing), len(hops)


def describe(layout, ranks_per_node):
    """The nodes, then for each axis which link its groups use."""
    if ranks_per_node < 1:
        raise UsageError(f"--ranks-per-node must be a positive integer, got {ranks_per_node}")
    nodes = -(-layout.world // ranks_per_node)
    lines = [f"nodes: {nodes} x {ranks_per_node} ranks (consecutive ranks on one node)"]
    for n in range(nodes):
        first, last = n * ranks_per_node, min(layout.world, (n + 1) * ranks_per_node) - 1
        lines.append(f"  node {n}: ranks {first}-{last}")
    lines.append("links:")
    for axis in layout.shown_axes():
        groups = layout.groups(axis)
        if len(groups[0]) == 1:
            lines.append(f"  {axis}: size 1, no communication")
            continue
        inside = sum(link(g, ranks_per_node) == "intra-node" for g in groups)
        if inside == len(groups):
            kind = f"all {len(groups)} groups intra-node"
        elif inside == 0:
            kind = f"all {len(groups)} groups inter-node"
        else:
            kind = f"{inside} of {len(groups)} groups intra-node, {len(groups) - inside} inter-node"
        what = f" - {WHAT[axis]}" if axis in WHAT else ""           # a new axis may not say yet
        lines.append(f"  {axis}: {kind} (rank 0's: {','.join(map(str, groups[0]))}){what}")
    if layout.pp > 1:
        crossing, total = pipeline_hops(layout, ranks_per_node)
        lines.append(f"  pipeline sends: {crossing} of {total} stage-to-stage hops cross nodes")
    return "\n".join(lines)


# --- where a job's ranks really ran: the hosts they report -----------------------------------------

def world_ranks(comm, world_comm):
    """The world ranks of ``comm``'s members, in ``comm``'s rank order (mpi4py communicators)."""
    group, world_group = comm.Get_group(), world_comm.Get_group()
    try:
        return [int(r) for r in group.Translate_ranks(list(range(comm.size)), world_group)]
    finally:
        group.Free()
        world_group.Free()


def span(ranks):
    """0,1,2,3,5 -> "0-3,5": a node's ranks, short."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(parts)


def node_boundary(hosts, members, volume):
    """Which groups and which bytes cross between the hosts the ranks ran on.

    hosts[r]: the host rank r reported; members[r]: {communicator name: its world ranks} of rank r;
    volume[r]: {communicator name: bytes rank r handed to MPI per step}.  A group crosses when its
    ranks ran on more than one host, and then all the bytes its ranks hand to MPI are counted as
    crossing (a 2-node pipeline's sends do; a world all-reduce's are an upper bound).
    Returns ({host: [ranks]}, {name: crosses}, {name: bytes across}, {name: bytes inside})."""
    nodes = {}
    for rank, host in enumerate(hosts):
        nodes.setdefault(host, []).append(rank)
    crosses, across, inside = {}, {}, {}
    for rank, groups in enumerate(members):
        for name, ranks in groups.items():
            if len(ranks) < 2:
                continue
            spans = len({hosts[r] for r in ranks}) > 1
            crosses[name] = crosses.get(name, False) or spans
            side = across if spans else inside
            side[name] = side.get(name, 0.0) + volume[rank].get(name, 0.0)
    return nodes, crosses, across, inside


def describe_boundary(hosts, members, volume, size):
    """The summary's lines on the node boundary (``size`` formats a byte count), or [] on one host."""
    nodes, crosses, across, inside = node_boundary(hosts, members, volume)
    if len(nodes) < 2:
        return []

    def moved(side):
        return ", ".join(f"{name} {size(b)}" for name, b in side.items() if b) or "none"
    return [f"  nodes       {len(nodes)}: " + ", ".join(f"{host} ranks {span(r)}" for host, r in nodes.items())
            + " (the hosts the ranks reported)",
            "  node links  inside a node: " + (", ".join(n for n, c in crosses.items() if not c) or "none")
            + "; across nodes: " + (", ".join(n for n, c in crosses.items() if c) or "none"),
            f"  bytes/step  across nodes {size(sum(across.values()))}: {moved(across)}; "
            f"inside nodes {size(sum(inside.values()))}: {moved(inside)}"]
