"""Which link each group of a grid crosses, once its ranks are placed on nodes.

Launchers (mpiexec, srun) put consecutive ranks on one node: node = rank // ranks_per_node.  A group
whose ranks share a node talks over the fast links inside it (NVLink, shared memory); a group that
spans nodes goes through the network, one to two orders of magnitude slower per GPU.  With the
rank order tp-dp-pp (TP fastest), TP groups stay inside a node as long as tp <= ranks per node;
the pipeline's neighbours are the furthest apart and cross first.
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
