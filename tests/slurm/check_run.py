"""Checks of a finished training job for tests/slurm/run.sh, read from what the job itself wrote.

  check_run.py boundary LOG TP PP DP       the node boundary, from the summary hpcpar train printed
  check_run.py hsdp LOG                     HSDP's shard groups inside a node, from the same summary
  check_run.py same-losses A B [FIRST]     two metrics files hold the same losses (from step FIRST on)

Prints what it checked, one line each; exits 1 with the reason when a check fails.
"""
import json
import re
import sys

from hpcpar.comm.grid import GridLayout

REL = 1e-9     # float64 runs of one layout on one node and on two agree far closer than this


def fail(why):
    print(f"    {why}")
    sys.exit(1)


def ranks(text):
    """"0-3,5" -> [0, 1, 2, 3, 5]"""
    out = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def summary_line(log, label):
    lines = [line for line in open(log, errors="replace") if line.startswith(f"  {label:<12}")]
    if not lines:
        fail(f"no '{label}' line in the summary of {log}")
    return lines[-1][14:].strip()


def boundary(log, tp, pp, dp):
    layout = GridLayout(int(tp) * int(pp) * int(dp), tp=int(tp), pp=int(pp), dp=int(dp))
    nodes = summary_line(log, "nodes")
    host = {}
    for name, members in re.findall(r"(\S+) ranks ([0-9]+(?:[-,][0-9]+)*)", nodes):
        for r in ranks(members):
            host[r] = name
    if sorted(host) != list(range(layout.world)):
        fail(f"the 'nodes' line does not place ranks 0-{layout.world - 1}: {nodes}")
    for group in layout.groups("tp"):
        if len({host[r] for r in group}) != 1:
            fail(f"tp group {group} ran on {sorted({host[r] for r in group})}, not on one node")
    print(f"    every tp group's ranks reported one host: {nodes}")
    for r in range(layout.world):
        nxt = layout.pipeline_neighbours(r)[1]
        if nxt is not None and host[r] == host[nxt]:
            fail(f"pipeline neighbours {r} and {nxt} both ran on {host[r]}")
    print("    every pair of pipeline neighbours reported two hosts")
    links = summary_line(log, "node links")
    inside, across = re.fullmatch(r"inside a node: (.*); across nodes: (.*)", links).groups()
    if "tp" not in inside.split(", ") or "pp" not in across.split(", "):
        fail(f"expected tp inside a node and pp across nodes: {links}")
    moved = summary_line(log, "bytes/step")
    crossing = re.fullmatch(r"across nodes [^:]+: (.*); inside nodes .*", moved).group(1)
    names = [part.split()[0] for part in crossing.split(", ")]
    # the pipeline's sends, the first and last stage's tied embedding gradients and the loss scalars
    if names[0] != "pp" or not set(names) <= {"pp", "embed", "world", "mp"}:
        fail(f"the bytes across nodes are not the pipeline's: {moved}")
    print(f"    bytes/step {moved}")


def hsdp(log):
    """A ZeRO-3 run with --dp-shard one node's ranks: from its per-group byte counters, every all-gather
    and reduce-scatter of the shard groups (dp_shard) moved inside a node, and only the all-reduce of
    each owned range across the groups (dp_across) and the loss scalars (world) crossed between them."""
    links = summary_line(log, "node links")
    inside, across = (side.split(", ") for side in
                      re.fullmatch(r"inside a node: (.*); across nodes: (.*)", links).groups())
    if "dp_shard" not in inside or "dp_shard" in across or "dp_across" not in across:
        fail(f"expected the shard groups inside a node and the groups across them across nodes: {links}")
    print(f"    node links {links}")
    moved = summary_line(log, "bytes/step")
    crossing, kept = re.fullmatch(r"across nodes [^:]+: (.*); inside nodes [^:]+: (.*)", moved).groups()
    names = {part.split()[0] for part in crossing.split(", ")}
    if not names <= {"dp_across", "world"} or "dp_across" not in names:
        fail(f"bytes other than the all-reduce across the shard groups crossed between the nodes: {moved}")
    if "dp_shard" not in {part.split()[0] for part in kept.split(", ")}:
        fail(f"the shard groups moved nothing inside the nodes: {moved}")
    print(f"    bytes/step {moved}")


def losses(path):
    with open(path) as f:
        return {row["step"]: row["loss"] for row in map(json.loads, f)}


def same_losses(a, b, first=0):
    la, lb = losses(a), losses(b)
    steps = sorted(s for s in la if s >= int(first))
    if not steps or steps != sorted(s for s in lb if s >= int(first)):
        fail(f"{a} and {b} hold different steps: {sorted(la)} and {sorted(lb)}")
    worst = max(abs(la[s] - lb[s]) / abs(lb[s]) for s in steps)
    if worst > REL:
        fail(f"losses differ by {worst:.2e} (relative) between {a} and {b}")
    print(f"    the losses of steps {steps[0]}-{steps[-1]} agree to {worst:.1e} (relative)")


if __name__ == "__main__":
    {"boundary": boundary, "hsdp": hsdp, "same-losses": same_losses}[sys.argv[1]](*sys.argv[2:])
