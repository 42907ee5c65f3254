"""The process grid: MPI.COMM_WORLD seen as a 4D array of ranks with axes tp, cp, pp and dp.

With the default order (tensor fastest, then context, then data, then pipeline - Megatron's):

    rank = tp_i + TP * (cp_i + CP * (dp_i + DP * pp_i))

so a tensor-parallel group is TP consecutive ranks (one server: the fastest links, for the traffic
that happens inside every layer), a context-parallel ring comes next (key/value blocks in every
attention layer), pipeline neighbours are TP*CP*DP ranks apart (across servers: one activation per
micro-batch), and data-parallel replicas fill the rest (one gradient all-reduce per step).  The
context-parallel size defaults to 1: the grid is then the 3D tp x pp x dp one, rank for rank, and
an order may leave cp out (it then sits right after tp).  ``GridLayout`` is the pure arithmetic
(usable without MPI, for teaching and planning); ``ParallelGrid`` adds the communicators.
"""
from dataclasses import dataclass
from itertools import product

from hpcpar.runtime import UsageError

AXES = ("tp", "cp", "pp", "dp")
DEFAULT_ORDER = "tp-dp-pp"   # fastest-varying axis first; cp, left out, goes right after tp


def parse_order(order):
    axes = tuple(order.split("-"))
    if "cp" not in axes and "tp" in axes:
        axes = axes[:axes.index("tp") + 1] + ("cp",) + axes[axes.index("tp") + 1:]
    if sorted(axes) != sorted(AXES):
        raise UsageError(f"rank order {order!r} must name tp, pp and dp once each (and cp, optional), "
                         f"fastest first (e.g. {DEFAULT_ORDER})")
    return axes


@dataclass(frozen=True)
class Coord:
    tp: int
    pp: int
    dp: int
    cp: int = None      # None: the grid has no context-parallel axis (cp = 1)

    def __str__(self):
        cp = "" if self.cp is None else f".cp{self.cp}"
        return f"tp{self.tp}{cp}.pp{self.pp}.dp{self.dp}"

    def as_dict(self):
        """{tp, pp, dp} and cp when the grid has that axis: what a flight record stores."""
        return {a: getattr(self, a) for a in ("tp", "cp", "pp", "dp") if getattr(self, a) is not None}

    def words(self):
        """'tp 0, pp 1, dp 0' (with 'cp 1' after tp when the grid has that axis): the error lines' form."""
        return ", ".join(f"{axis} {value}" for axis, value in self.as_dict().items())


class GridLayout:
    """Which rank sits where in a TP x CP x PP x DP grid. Pure arithmetic, no MPI."""

    def __init__(self, tp, pp, dp, world, order=DEFAULT_ORDER, cp=1):
        for axis, n in (("tp", tp), ("cp", cp), ("pp", pp), ("dp", dp)):
            if not isinstance(n, int) or n < 1:
                raise UsageError(f"{axis} must be a positive integer, got {n!r}")
        if tp * cp * pp * dp != world:
            names, sizes = ("tp x pp x dp", f"{tp} x {pp} x {dp}") if cp == 1 else \
                ("tp x cp x pp x dp", f"{tp} x {cp} x {pp} x {dp}")
            raise UsageError(f"{names} = {sizes} = {tp * cp * pp * dp} does not match the world size {world}")
        self.tp, self.cp, self.pp, self.dp, self.world = tp, cp, pp, dp, world
        self.order = parse_order(order)
        # stride of each axis in the rank number: the fastest axis has stride 1
        self.stride, step = {}, 1
        for axis in self.order:
            self.stride[axis] = step
            step *= self.size(axis)

    def size(self, axis):
        return getattr(self, axis)

    def coord(self, rank):
        at = {a: (rank // self.stride[a]) % self.size(a) for a in AXES}
        return Coord(at["tp"], at["pp"], at["dp"], at["cp"] if self.cp > 1 else None)

    def rank(self, tp, pp, dp, cp=0):
        return tp * self.stride["tp"] + (cp or 0) * self.stride["cp"] + pp * self.stride["pp"] \
            + dp * self.stride["dp"]

    def group(self, rank, axis):
        """The ranks that share every coordinate with ``rank`` except ``axis`` (ordered along it)."""
        c = self.coord(rank)
        members = []
        for i in range(self.size(axis)):
            fields = {a: getattr(c, a) or 0 for a in AXES}
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
        prev = self.rank(c.tp, c.pp - 1, c.dp, c.cp) if c.pp > 0 else None
        nxt = self.rank(c.tp, c.pp + 1, c.dp, c.cp) if c.pp < self.pp - 1 else None
        return prev, nxt

    def shown_axes(self):
        """The axes a map names: cp only when the grid has a context-parallel axis."""
        return tuple(a for a in AXES if a != "cp" or self.cp > 1)

    def describe(self):
        """The rank map as a table: one row per rank with its coordinates, groups and neighbours."""
        axes = self.shown_axes()
        order = "-".join(a for a in self.order if a in axes)
        head = f"{'rank':>4}  " + " ".join(f"{a:>2}" for a in axes) + "  " \
            + "".join(f"{a + ' group':<14} " for a in axes) + f"{'prev':>4} {'next':>4}"
        sizes = " x ".join(f"{a}={self.size(a)}" for a in axes)
        lines = [f"grid {sizes} = {self.world} ranks (order {order}, fastest first)", head, "-" * len(head)]
        for r in range(self.world):
            c = self.coord(r)
            prev, nxt = self.pipeline_neighbours(r)
            fmt = lambda g: ",".join(map(str, g))  # noqa: E731
            lines.append(f"{r:>4}  " + " ".join(f"{getattr(c, a):>2}" for a in axes) + "  "
                         + "".join(f"{fmt(self.group(r, a)):<14} " for a in axes)
                         + f"{'-' if prev is None else prev:>4} {'-' if nxt is None else nxt:>4}")
        return "\n".join(lines)

    def picture(self):
        """Pipeline stages as boxes of TP ranks, one row per replica (and context-parallel rank): the
        grid drawn as a row of 2D slices."""
        rows = []
        for dp_i in range(self.dp):
            for cp_i in range(self.cp):
                cells = []
                for pp_i in range(self.pp):
                    ranks = [self.rank(t, pp_i, dp_i, cp_i) for t in range(self.tp)]
                    cells.append("[" + " ".join(f"{r:>2}" for r in ranks) + "]")
                name = f"dp {dp_i}" + (f" cp {cp_i}" if self.cp > 1 else "")
                rows.append(f"{name}: " + " -> ".join(cells))
        pad = " " * (len(rows[0].split(":")[0]) - 4)
        return f"stage: {pad} " + "  ".join(f"pp {p}".center(3 * self.tp + 2) for p in range(self.pp)) \
            + "\n" + "\n".join(rows)


def factorisations(world):
    """Every (tp, pp, dp) with tp * pp * dp == world."""
    return [(t, p, world // (t * p)) for t, p in product(range(1, world + 1), repeat=2)
            if world % (t * p) == 0]


class ParallelGrid(GridLayout):
    """The grid of this MPI job: coordinates of this rank and its tp, cp, pp, dp sub-communicators.

    Communicators (``hpcpar.comm.Communicator``, with byte counters):
      tp  - ranks that shard the same layers (all-reduces inside every layer)
      cp  - the ranks that hold the parts of one sequence (ring attention's point-to-point blocks);
            COMM_SELF when cp = 1
      pp  - the stages of one pipeline (point-to-point activations and gradients)
      dp  - replicas of the same shard (gradient all-reduce once per step)
      dp_cp - every rank holding the same parameters, dp x cp of them: gradients are summed over it
            (context-parallel ranks saw other tokens of the same sequences); the dp group when cp = 1
      mp  - the model-parallel group tp x pp of one replica (global grad norm)
    and, on demand, ``comm_among(axis, coordinates)``: a part of one group (the pipeline ranks that hold
    the two ends of a tied embedding - which ones, the schedule's placement says).
    """

    def __init__(self, tp=1, pp=1, dp=1, comm=None, order=DEFAULT_ORDER, cp=1):
        from mpi4py import MPI
        from hpcpar.comm import Communicator
        comm = comm if comm is not None else MPI.COMM_WORLD
        # Validation uses only local facts (the world size), so a bad layout is refused identically
        # on every rank before the first collective below.
        super().__init__(tp, pp, dp, comm.size, order, cp)
        self.world_comm = Communicator(comm, "world")
        self.rank_id = comm.rank
        self.coords = c = self.coord(comm.rank)
        self.tp_rank, self.pp_rank, self.dp_rank, self.cp_rank = c.tp, c.pp, c.dp, c.cp or 0
        self.prev_rank, self.next_rank = self.pipeline_neighbours(comm.rank)
        k = self.cp_rank
        # Split(color, key): ranks with equal color form a group, ordered by key.
        self.tp_comm = Communicator(comm.Split(self.rank(0, c.pp, c.dp, k), c.tp), "tp")
        self.pp_comm = Communicator(comm.Split(self.rank(c.tp, 0, c.dp, k), c.pp), "pp")
        self.dp_comm = Communicator(comm.Split(self.rank(c.tp, c.pp, 0, k), c.dp), "dp")
        if cp > 1:
            self.cp_comm = Communicator(comm.Split(self.rank(c.tp, c.pp, c.dp, 0), k), "cp")
            self.dp_cp_comm = Communicator(comm.Split(self.rank(c.tp, c.pp, 0, 0), c.dp * cp + k), "dp_cp")
        else:
            self.cp_comm, self.dp_cp_comm = Communicator(MPI.COMM_SELF, "cp"), self.dp_comm
        self.mp_comm = Communicator(comm.Split(c.dp * cp + k, c.pp * tp + c.tp), "mp")
        self.parts = []         # the communicators comm_among made

    def comm_among(self, axis, coordinates, name):
        """Collective over the world: a Communicator of the ranks of this rank's ``axis`` group whose
        ``axis`` coordinate is in ``coordinates`` (ranked in that order); None on the other ranks."""
        from mpi4py import MPI
        from hpcpar.comm import Communicator
        coordinates = list(coordinates)
        mine = getattr(self.coords, axis)
        inside = mine in coordinates
        at = {a: getattr(self.coords, a) or 0 for a in AXES}
        at[axis] = coordinates[0]
        part = self.world_comm.mpi.Split(self.rank(**at) if inside else MPI.UNDEFINED,
                                         coordinates.index(mine) if inside else 0)
        if not inside:
            return None
        self.parts.append(Communicator(part, name))
        return self.parts[-1]

    def communicators(self):
        comms = [self.tp_comm, self.pp_comm, self.dp_comm, self.mp_comm, self.world_comm]
        comms += [self.cp_comm, self.dp_cp_comm] if self.cp > 1 else []
        return comms + self.parts

    def free(self):
        """Release the sub-communicators (tests build many grids in one job)."""
        for c in self.communicators():
            if c is not self.world_comm:
                c.mpi.Free()

    def __str__(self):
        return f"rank {self.rank_id} ({self.coords})"
