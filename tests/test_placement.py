"""Where a run's ranks really were: the node boundary from the hosts they report (no MPI needed)."""
from hpcpar.comm.placement import describe_boundary, node_boundary, span
from hpcpar.training.summary import _size


def two_nodes():
    """tp 4 x pp 2 on two hosts of 4 ranks: tp groups inside a host, the pipeline across."""
    hosts = ["node1"] * 4 + ["node2"] * 4
    members = [{"tp": [r // 4 * 4 + i for i in range(4)], "pp": [r % 4, r % 4 + 4], "dp": [r],
                "world": list(range(8))} for r in range(8)]
    volume = [{"tp": 1000.0, "pp": 300.0, "world": 12.0} for _ in range(8)]
    return hosts, members, volume


def test_span_shortens_runs_of_ranks():
    assert span([0, 1, 2, 3]) == "0-3"
    assert span([0, 2, 3, 4, 7]) == "0,2-4,7"
    assert span([5]) == "5"


def test_the_bytes_of_groups_that_span_hosts_cross():
    nodes, crosses, across, inside = node_boundary(*two_nodes())
    assert nodes == {"node1": [0, 1, 2, 3], "node2": [4, 5, 6, 7]}
    assert crosses == {"tp": False, "pp": True, "world": True}        # dp has one rank: no group
    assert across == {"pp": 8 * 300.0, "world": 8 * 12.0}
    assert inside == {"tp": 8 * 1000.0}


def test_the_summary_says_it_only_for_more_than_one_host():
    hosts, members, volume = two_nodes()
    lines = describe_boundary(hosts, members, volume, _size)
    assert lines[0] == "  nodes       2: node1 ranks 0-3, node2 ranks 4-7 (the hosts the ranks reported)"
    assert lines[1] == "  node links  inside a node: tp; across nodes: pp, world"
    assert lines[2] == "  bytes/step  across nodes 2.4 KB: pp 2.3 KB, world 96 B; inside nodes 7.8 KB: tp 7.8 KB"
    assert describe_boundary(["vm"] * 8, members, volume, _size) == []
