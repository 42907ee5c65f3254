"""The process grid: MPI.COMM_WORLD seen as a 3D array of ranks with axes tp, pp and dp.

With the default order (tensor fastest, then data, then pipeline - Megatron's):

    rank = tp_i + TP * (dp_i + DP * pp_i)

so a tensor-parallel group is TP consecutive ranks (one server: the fastest links, for the traffic
that happens inside every layer), pipeline neighbours are TP*DP ranks apart (across servers: one
activation per micro-batch), and data-parallel replicas fill the rest (one gradient all-reduce per
step).  ``GridLayout`` is the pure arithmetic (usable without MPI, for teaching and planning);
``ParallelGrid`` adds the communicators.
"""
from dataclasses import dataclass
from itertools import product

from hpcpar.runtime import UsageError

AXES = ("tp", "pp", "dp")
DEFAULT_ORDER = "tp-dp-pp"   # fastest-varying axis first


def parse_order(order):
    axes = tuple(order.split("-"))
    if sorted(axes) != sorted(AXES):
        raise UsageError(f"rank order {order!r} must name tp, pp and dp once each, fastest first "
                         f"(e.g. {DEFAULT_ORDER})")
    return axes


@dataclass(frozen=True)
class Coord:
    tp: int
    pp: int
    dp: int

    def __str__(self):
        return f"tp{self.tp}.pp{self.pp}.dp{self.dp}"


class GridLayout:
    """Which rank sits where in a TP x PP x DP grid. Pure arithmetic, no MPI."""

    def __init__(self, tp, pp, dp, world, order=DEFAULT_ORDER):
        for axis, n in zip(AXES, (tp, pp, dp)):
            if not isinstance(n, int) or n < 1:
                raise UsageError(f"{axis} must be a positive integer, got {n!r}")
        if tp * pp * dp != world:
            raise UsageError(f"tp x pp x dp = {tp} x {pp} x {dp} = {tp * pp * dp} does not match "
                             f"the world size {world}")
        self.tp, self.pp, self.dp, self.world = tp, pp, dp, world
        self.order = parse_order(order)
        # stride of each axis in the rank number: the fastest axis has stride 1
        self.stride, step = {}, 1
        for axis in self.order:
            self.stride[axis] = step
            step *= self.size(axis)

    def size(self, axis):
        return getattr(self, axis)

    def coord(self, rank):
        return Coord(*((rank // self.stride[a]) % self.size(a) for a in AXES))

    def rank(self, tp, pp, dp):
        return tp * self.stride["tp"] + pp * self.stride["pp"] + dp * self.stride["dp"]

    def group(self, rank, axis):
        """The ranks that share every coordinate with ``rank`` except ``axis`` (ordered along it)."""
        c = self.coord(rank)
        members = []
        for i in range(self.size(axis)):
            fields = {a: getattr(c, a) for a in AXES}
            fields[axis] = i
            members.append(self.rank(**fields))
        return members

    def groups(self, axis):
        """Every group along ``axis``: a partition of the world."""
        seen, out = set(), []
        for r in range(self.world):
            g = tuple(self.group(r, axis))
            if g not in seen:
                seen.add(g)
                out.append(g)
        return out

    def pipeline_neighbours(self, rank):
        """(previous, next) stage ranks in this rank's pipeline; None at the ends."""
        c = self.coord(rank)
        prev = self.rank(c.tp, c.pp - 1, c.dp) if c.pp > 0 else None
        nxt = self.rank(c.tp, c.pp + 1, c.dp) if c.pp < self.pp - 1 else None
        return prev, nxt

    def describe(self):
        """The rank map as a table: one row per rank with its coordinates, groups and neighbours."""
        head = f"{'rank':>4}  {'tp':>2} {'pp':>2} {'dp':>2}  {'tp group':<14} {'pp group':<14} " \
               f"{'dp group':<14} {'prev':>4} {'next':>4}"
        lines = [f"grid tp={self.tp} x pp={self.pp} x dp={self.dp} = {self.world} ranks "
                 f"(order {'-'.join(self.order)}, fastest first)", head, "-" * len(head)]
        for r in range(self.world):
            c = self.coord(r)
            prev, nxt = self.pipeline_neighbours(r)
            fmt = lambda g: ",".join(map(str, g))  # noqa: E731
            lines.append(f"{r:>4}  {c.tp:>2} {c.pp:>2} {c.dp:>2}  {fmt(self.group(r, 'tp')):<14} "
                         f"{fmt(self.group(r, 'pp')):<14} {fmt(self.group(r, 'dp')):<14} "
                         f"{'-' if prev is None else prev:>4} {'-' if nxt is None else nxt:>4}")
        return "\n".join(lines)

    def picture(self):
        """Pipeline stages as boxes of TP x DP ranks: the 3D grid drawn as a row of 2D slices."""
        rows = []
        for dp_i in range(self.dp):
            cells = []
            for pp_i in range(self.pp):
                ranks = [self.rank(t, pp_i, dp_i) for t in range(self.tp)]
                cells.append("[" + " ".join(f"{r:>2}" for r in ranks) + "]")
            rows.append(f"dp {dp_i}: " + " -> ".join(cells))
        return "stage:  " + "  ".join(f"pp {p}".center(3 * self.tp + 2) for p in range(self.pp)) \
            + "\n" + "\n".join(rows)


def factorisations(world):
    """Every (tp, pp, dp) with tp * pp * dp == world."""
    return [(t, p, world // (t * p)) for t, p in product(range(1, world + 1), repeat=2)
            if world % (t * p) == 0]


class ParallelGrid(GridLayout):
    """The grid of this MPI job: coordinates of this rank and its tp, pp, dp sub-communicators.

    Communicators (``hpcpar.comm.Communicator``, with byte counters):
      tp  - ranks that shard the same layers (all-reduces inside every layer)
      pp  - the stages of one pipeline (point-to-point activations and gradients)
      dp  - replicas of the same shard (gradient all-reduce once per step)
      mp  - the model-parallel group tp x pp of one replica (global grad norm)
      embed - first and last stage of one pipeline (tied embedding gradients); None elsewhere
    """

    def __init__(self, tp=1, pp=1, dp=1, comm=None, order=DEFAULT_ORDER):
        from mpi4py import MPI
        from hpcpar.comm import Communicator
        comm = comm if comm is not None else MPI.COMM_WORLD
        # Validation uses only local facts (the world size), so a bad layout is refused identically
        # on every rank before the first collective below.
        super().__init__(tp, pp, dp, comm.size, order)
        self.world_comm = Communicator(comm, "world")
        self.rank_id = comm.rank
        self.coords = self.coord(comm.rank)
        self.tp_rank, self.pp_rank, self.dp_rank = self.coords.tp, self.coords.pp, self.coords.dp
        self.is_first_stage = self.pp_rank == 0
        self.is_last_stage = self.pp_rank == pp - 1
        self.prev_rank, self.next_rank = self.pipeline_neighbours(comm.rank)
        c = self.coords
        # Split(color, key): ranks with equal color form a group, ordered by key.
        self.tp_comm = Communicator(comm.Split(self.rank(0, c.pp, c.dp), c.tp), "tp")
        self.pp_comm = Communicator(comm.Split(self.rank(c.tp, 0, c.dp), c.pp), "pp")
        self.dp_comm = Communicator(comm.Split(self.rank(c.tp, c.pp, 0), c.dp), "dp")
        self.mp_comm = Communicator(comm.Split(c.dp, c.pp * tp + c.tp), "mp")
        in_embed = pp > 1 and (self.is_first_stage or self.is_last_stage)
        embed = comm.Split(self.rank(c.tp, 0, c.dp) if in_embed else MPI.UNDEFINED, c.pp)
        self.embed_comm = Communicator(embed, "embed") if in_embed else None

    def communicators(self):
        comms = [self.tp_comm, self.pp_comm, self.dp_comm, self.mp_comm, self.world_comm]
        return comms + ([self.embed_comm] if self.embed_comm else [])

    def free(self):
        """Release the sub-communicators (tests build many grids in one job)."""
        for c in self.communicators():
            if c is not self.world_comm:
                c.mpi.Free()

    def __str__(self):
        return f"rank {self.rank_id} ({self.coords})"
