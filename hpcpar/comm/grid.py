"""The process grid: MPI.COMM_WORLD seen as an array of ranks with one dimension per axis of ``AXES``.

With the default order (tensor fastest, then context, then data, then pipeline - Megatron's):

    rank = tp_i + TP * (cp_i + CP * (dp_i + DP * pp_i))

so a tensor-parallel group is TP consecutive ranks (one server: the fastest links, for the traffic
that happens inside every layer), a context-parallel ring comes next (key/value blocks in every
attention layer), pipeline neighbours are TP*CP*DP ranks apart (across servers: one activation per
micro-batch), and data-parallel replicas fill the rest (one gradient all-reduce per step).

The grid knows its axes only from ``AXES``: a new one is one more word there, and sizes, orders,
coordinates, groups and communicators follow; an axis that lives inside a group is a *fold* of it
(``fold``: expert parallelism inside dp x cp, HSDP's shard groups inside the replicas).  The axes of
``NAMED`` - tp, pp and dp - are in every order, map and coordinate; another axis is left out of them
while its size is 1 (the grid is then the smaller one, rank for rank), and an order may leave it out:
it then sits right after the axis before it in ``AXES`` (cp right after tp).  ``GridLayout`` is the pure arithmetic (usable
without MPI, for teaching and planning); ``ParallelGrid`` adds the communicators.
"""
from collections.abc import Mapping
from itertools import product

from hpcpar.runtime import UsageError

AXES = ("tp", "cp", "pp", "dp")     # every axis of the grid, in the order maps and coordinates show them
NAMED = ("tp", "pp", "dp")          # the axes every grid names, whatever their size
DEFAULT_ORDER = "tp-dp-pp"          # fastest-varying axis first; cp, left out, goes right after tp


def parse_order(order):
    axes = list(order.split("-"))
    optional = [a for a in AXES if a not in NAMED]
    if len(set(axes)) != len(axes) or not set(NAMED) <= set(axes) <= set(AXES):
        raise UsageError(f"rank order {order!r} must name {', '.join(NAMED[:-1])} and {NAMED[-1]} once each "
                         f"(and {', '.join(optional)}, optional), fastest first (e.g. {DEFAULT_ORDER})")
    for i, axis in enumerate(AXES):         # an axis left out goes right after the one before it in AXES
        if axis not in axes:
            axes.insert(axes.index(AXES[i - 1]) + 1 if i else 0, axis)
    return tuple(axes)


class Coord(Mapping):
    """Where a rank sits: axis -> index, for the axes its grid names, in ``AXES`` order.  Read as a
    mapping (``c["tp"]``, ``dict(c)``) or by attribute (``c.tp``; None for an axis the grid leaves out)."""

    def __init__(self, **at):
        unknown = set(at) - set(AXES)
        if unknown:
            raise TypeError(f"Coord: unknown axes {sorted(unknown)} (axes: {', '.join(AXES)})")
        self._at = {a: at[a] for a in AXES if at.get(a) is not None}

    def __getitem__(self, axis):
        return self._at[axis]

    def __iter__(self):
        return iter(self._at)

    def __len__(self):
        return len(self._at)

    def __getattr__(self, axis):
        if axis in AXES:
            return self.__dict__["_at"].get(axis)
        raise AttributeError(axis)

    def __hash__(self):
        return hash(tuple(self._at.items()))

    def __repr__(self):
        return "Coord(" + ", ".join(f"{a}={i}" for a, i in self._at.items()) + ")"

    def __str__(self):
        return ".".join(f"{a}{i}" for a, i in self._at.items())

    def as_dict(self):
        """{axis: index} of the axes the grid names: what a flight record stores."""
        return dict(self._at)

    def words(self):
        """'tp 0, pp 1, dp 0' (with 'cp 1' after tp when the grid has that axis): the error lines' form."""
        return ", ".join(f"{axis} {value}" for axis, value in self._at.items())


class GridLayout:
    """Which rank sits where in a grid of the axes ``AXES``. Pure arithmetic, no MPI.

    ``GridLayout(8, tp=2, pp=2, dp=2)``: the sizes by axis name (1 for an axis not given)."""

    def __init__(self, world, order=DEFAULT_ORDER, **sizes):
        unknown = set(sizes) - set(AXES)
        if unknown:
            raise UsageError(f"unknown grid axes {', '.join(sorted(unknown))} (axes: {', '.join(AXES)})")
        self.sizes = {a: sizes.get(a, 1) for a in AXES}
        for axis, n in self.sizes.items():
            if not isinstance(n, int) or n < 1:
                raise UsageError(f"{axis} must be a positive integer, got {n!r}")
        self.world = world
        total = 1
        for n in self.sizes.values():
            total *= n
        if total != world:
            axes = self.shown_axes()
            raise UsageError(f"{' x '.join(axes)} = {' x '.join(str(self.sizes[a]) for a in axes)} = {total} "
                             f"does not match the world size {world}")
        self.order = parse_order(order)
        # stride of each axis in the rank number: the fastest axis has stride 1
        self.stride, step = {}, 1
        for axis in self.order:
            self.stride[axis] = step
            step *= self.sizes[axis]

    def __getattr__(self, axis):
        """The size of an axis: ``layout.tp``."""
        if axis in AXES and "sizes" in self.__dict__:
            return self.sizes[axis]
        raise AttributeError(axis)

    def size(self, axis):
        return self.sizes[axis]

    def index(self, rank):
        """{axis: index} of ``rank`` along every axis of AXES (0 along an axis of size 1)."""
        return {a: (rank // self.stride[a]) % self.sizes[a] for a in AXES}

    def coord(self, rank):
        at = self.index(rank)
        return Coord(**{a: at[a] for a in self.shown_axes()})

    def rank(self, coord=(), **at):
        """The rank at ``coord`` (a mapping, e.g. a Coord) with the axes ``at`` moved: ``rank(c, pp=0)``.
        An axis given nowhere is at 0."""
        at = {**dict(coord), **at}
        return sum((at.get(a) or 0) * self.stride[a] for a in AXES)

    def group(self, rank, *axes):
        """The ranks that share every coordinate with ``rank`` except ``axes``, the first axis slowest
        (one axis: ordered along it)."""
        at = self.index(rank)
        return [self.rank(at, **dict(zip(axes, i))) for i in product(*(range(self.sizes[a]) for a in axes))]

    def groups(self, *axes):
        """Every group along ``axes``: a partition of the world."""
        seen, out = set(), []
        for r in range(self.world):
            g = tuple(self.group(r, *axes))
            if g not in seen:
                seen.add(g)
                out.append(g)
        return out

    def folded(self, rank, members, size):
        """An axis of ``size`` folded into the group ``members``: (this rank's block of ``size`` consecutive
        members, its complement: the members at its place in every block) - ep in dp x cp: the ep and
        the expert-data-parallel groups; HSDP: the shard group and the ranks across the groups."""
        if size < 1 or len(members) % size:
            raise UsageError(f"a group of {len(members)} ranks does not fold into blocks of {size}")
        i = members.index(rank)
        start = i - i % size
        return members[start:start + size], members[i % size::size]

    def pipeline_neighbours(self, rank):
        """(previous, next) stage ranks in this rank's pipeline; None at the ends."""
        c = self.index(rank)
        prev = self.rank(c, pp=c["pp"] - 1) if c["pp"] > 0 else None
        nxt = self.rank(c, pp=c["pp"] + 1) if c["pp"] < self.pp - 1 else None
        return prev, nxt

    def shown_axes(self):
        """The axes a map names: those of NAMED, and any other one larger than 1."""
        return tuple(a for a in AXES if a in NAMED or self.sizes[a] > 1)

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
            lines.append(f"{r:>4}  " + " ".join(f"{c[a]:>2}" for a in axes) + "  "
                         + "".join(f"{fmt(self.group(r, a)):<14} " for a in axes)
                         + f"{'-' if prev is None else prev:>4} {'-' if nxt is None else nxt:>4}")
        return "\n".join(lines)

    def picture(self):
        """Pipeline stages as boxes of TP ranks, one row per place along the other axes (dp, then cp):
        the grid drawn as a row of 2D slices."""
        rows_by = [a for a in reversed(AXES) if a not in ("tp", "pp")]
        rows = []
        for at in product(*(range(self.sizes[a]) for a in rows_by)):
            at = dict(zip(rows_by, at))
            cells = []
            for pp_i in range(self.pp):
                ranks = [self.rank(at, tp=t, pp=pp_i) for t in range(self.tp)]
                cells.append("[" + " ".join(f"{r:>2}" for r in ranks) + "]")
            name = " ".join(f"{a} {at[a]}" for a in rows_by if a in self.shown_axes())
            rows.append(f"{name}: " + " -> ".join(cells))
        pad = " " * (len(rows[0].split(":")[0]) - 4)
        return f"stage: {pad} " + "  ".join(f"pp {p}".center(3 * self.tp + 2) for p in range(self.pp)) \
            + "\n" + "\n".join(rows)


def factorisations(world):
    """Every (tp, pp, dp) with tp * pp * dp == world."""
    return [(t, p, world // (t * p)) for t, p in product(range(1, world + 1), repeat=2)
            if world % (t * p) == 0]


class ParallelGrid(GridLayout):
    """The grid of this MPI job: coordinates of this rank and its sub-communicators.

    Communicators (``hpcpar.comm.Communicator``, with byte counters), one per axis of AXES as
    ``<axis>_comm`` (and this rank's index along it as ``<axis>_rank``):
      tp  - ranks that shard the same layers (all-reduces inside every layer)
      cp  - the ranks that hold the parts of one sequence (ring attention's point-to-point blocks)
      pp  - the stages of one pipeline (point-to-point activations and gradients)
      dp  - replicas of the same shard (gradient all-reduce once per step)
    and over several axes, ``comm_over(*axes)``:
      dp_cp - every rank holding the same parameters, dp x cp of them: gradients are summed over it
            (context-parallel ranks saw other tokens of the same sequences); the dp group when cp = 1
      mp  - the model-parallel group tp x pp of one replica (global grad norm)
    and, on demand, ``comm_among(axis, coordinates)``: a part of one group (the pipeline ranks that hold
    the two ends of a tied embedding - which ones, the schedule's placement says), and ``fold``'s groups.
    """

    def __init__(self, comm=None, order=DEFAULT_ORDER, **sizes):
        from mpi4py import MPI
        comm = comm if comm is not None else MPI.COMM_WORLD
        # Validation uses only local facts (the world size), so a bad layout is refused identically
        # on every rank before the first collective below.
        super().__init__(comm.size, order, **sizes)
        from hpcpar.comm import Communicator
        self.world_comm = Communicator(comm, "world")
        self.rank_id = comm.rank
        self.coords = self.coord(comm.rank)
        self.prev_rank, self.next_rank = self.pipeline_neighbours(comm.rank)
        self._made = {}         # axes (a fold's: name and ranks) -> (axes, Communicator, its world ranks)
        self.parts = []         # the communicators comm_among made
        for axis, i in self.index(comm.rank).items():
            setattr(self, f"{axis}_rank", i)
            setattr(self, f"{axis}_comm", self.comm_over(axis))
        self.dp_cp_comm = self.comm_over("dp", "cp")
        self.mp_comm = self.comm_over("pp", "tp", name="mp")

    def comm_over(self, *axes, name=None):
        """The ranks that differ from this one only along ``axes``, ranked with the first axis slowest
        (collective over the world the first time; the same Communicator after).  An axis of size 1
        but the first adds nobody: ``comm_over("dp", "cp")`` is the dp group itself when cp = 1, and a
        group of its own (counted apart from cp's ring) when dp = 1 < cp.  ``name``: a
        communicator of its own under that name (counted apart), whatever its members."""
        wide = axes[:1] + tuple(a for a in axes[1:] if self.sizes[a] > 1)
        return self._comm(name or wide, wide, self.group(self.rank_id, *wide), name or "_".join(wide))

    def fold(self, group, size, names):
        """Collective over the world: ``folded``'s groups of ``group`` (this grid's), named ``names``."""
        axes, members = next((axes, ranks) for axes, c, ranks in self._made.values() if c is group)
        return tuple(self._comm((name,) + tuple(ranks), axes, ranks, name)
                     for ranks, name in zip(self.folded(self.rank_id, members, size), names))

    def _comm(self, key, axes, ranks, name):
        """The Communicator of ``ranks`` (this rank's group in a partition of the world), made once."""
        if key not in self._made:
            from hpcpar.comm import Communicator
            # Split(color, key): ranks with equal color form a group, ordered by key
            comm = Communicator(self.world_comm.mpi.Split(ranks[0], ranks.index(self.rank_id)), name)
            self._made[key] = (axes, comm, ranks)
        return self._made[key][1]

    def comm_among(self, axis, coordinates, name):
        """Collective over the world: a Communicator of the ranks of this rank's ``axis`` group whose
        ``axis`` coordinate is in ``coordinates`` (ranked in that order); None on the other ranks."""
        from mpi4py import MPI
        from hpcpar.comm import Communicator
        coordinates = list(coordinates)
        at = self.index(self.rank_id)
        inside = at[axis] in coordinates
        part = self.world_comm.mpi.Split(self.rank(at, **{axis: coordinates[0]}) if inside else MPI.UNDEFINED,
                                         coordinates.index(at[axis]) if inside else 0)
        if not inside:
            return None
        self.parts.append(Communicator(part, name))
        return self.parts[-1]

    def communicators(self):
        """Every communicator of this rank, each once: those over the axes a map names (an axis of size
        1 that the grid leaves out has nothing to say), the world, and the parts."""
        shown = set(self.shown_axes())
        return [c for axes, c, _ in self._made.values() if shown & set(axes)] + [self.world_comm] + self.parts

    def free(self):
        """Release the sub-communicators (tests build many grids in one job)."""
        for c in [c for _, c, _ in self._made.values()] + self.parts:
            c.mpi.Free()

    def __str__(self):
        return f"rank {self.rank_id} ({self.coords})"
