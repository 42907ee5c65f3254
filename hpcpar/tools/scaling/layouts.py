"""Which layout, and which global batch, each point of a scaling sweep runs.

``--ranks 1,2,4,8`` gives the rank counts.  ``--layouts`` gives one or more *series* separated by
commas; each series is one line on the plots.  A series is one layout, or several joined by ``/``:

    dp                          every rank data parallel: tp1pp1dp<N> at N ranks (likewise tp, pp)
    tp2dp                       tp stays 2, dp takes the rest: tp2pp1dp4 at 8 ranks
    tp2pp2dp2                   exactly this layout, so only at 8 ranks
    tp1/tp2/tp2pp2/tp2pp2dp2    one explicit layout per rank count (here 1, 2, 4 and 8)

A layout names each axis at most once, in any order; an axis it leaves out is 1, and one axis
written without a size (at most one per layout) grows: it takes whatever ranks the others leave.
At each rank count a series runs its explicit layout of exactly that size if it has one, else its
growing layout; a rank count that neither fits is refused before anything runs.

Strong scaling keeps the global batch (``--batch-size``) at every point: the same work on more ranks.
Weak scaling grows it with the ranks - ``--batch-size`` is then the batch *per rank*, and N ranks
train on N times as many sequences per step: the same work per rank.
"""
import math
import re
from dataclasses import dataclass

from hpcpar.tools.plan.layout import Layout
from hpcpar.runtime import UsageError

AXES = ("tp", "pp", "dp")
MODES = ("strong", "weak")
_LAYOUT = re.compile(r"(?:(?:tp|pp|dp)\d*)+")
_AXIS = re.compile(r"(tp|pp|dp)(\d*)")


def sizes(layout):
    """{tp, pp, dp} of a point's layout (the sweep sets nothing else of it): what a result records."""
    return {axis: getattr(layout, axis) for axis in AXES}


def label(layout):
    """A layout in the notation of --layouts, every axis sized: tp2pp1dp4."""
    return "tp{}pp{}dp{}".format(*(getattr(layout, axis) for axis in AXES))


@dataclass(frozen=True)
class Pattern:
    """One layout of a series: fixed axis sizes, and at most one axis that grows."""
    text: str
    sizes: tuple            # ((axis, size), ...) of the axes given a size
    grow: str | None        # the axis without a size, if any

    @property
    def block(self):
        """Ranks taken by the fixed axes: the whole layout when none grows."""
        return math.prod(size for _, size in self.sizes)

    def at(self, ranks):
        """This pattern's layout at ``ranks`` ranks, or None when it does not fit."""
        sizes = dict(self.sizes)
        if self.grow is None:
            return Layout(*(sizes.get(a, 1) for a in AXES)) if self.block == ranks else None
        if ranks % self.block:
            return None
        sizes[self.grow] = ranks // self.block
        return Layout(*(sizes.get(a, 1) for a in AXES))


@dataclass(frozen=True)
class Series:
    name: str               # as written on the command line: the label of its line on the plots
    patterns: tuple

    @property
    def slug(self):
        """The name as a piece of a file name."""
        return self.name.replace("/", "_")

    def layout(self, ranks):
        """The layout this series runs at ``ranks`` ranks; UsageError when it has none."""
        for pattern in self.patterns:
            if pattern.grow is None and pattern.block == ranks:
                return pattern.at(ranks)
        growing = [p for p in self.patterns if p.grow]
        if growing and growing[0].at(ranks):
            return growing[0].at(ranks)
        if growing:
            raise UsageError(f"--layouts {self.name}: {ranks} rank(s) do not split into blocks of "
                             f"{growing[0].block} ({growing[0].text} without {growing[0].grow})")
        sizes = ", ".join(str(p.block) for p in self.patterns)
        raise UsageError(f"--layouts {self.name}: no layout of {ranks} rank(s) (its layouts have {sizes}); "
                         f"give one per rank count, or one axis without a size to grow")


def parse_pattern(text):
    if not _LAYOUT.fullmatch(text):
        raise UsageError(f"--layouts: {text!r} is not a layout: write axes and sizes such as tp2pp2dp2, "
                         f"leaving one axis without a size to grow (tp2dp), or just dp, tp or pp")
    sizes, growing = {}, []
    for axis, size in _AXIS.findall(text):
        if axis in sizes or axis in growing:
            raise UsageError(f"--layouts: {text!r} names {axis} twice")
        if not size:
            growing.append(axis)
        elif int(size) < 1:
            raise UsageError(f"--layouts: {text!r}: {axis} must be at least 1")
        else:
            sizes[axis] = int(size)
    if len(growing) > 1:
        raise UsageError(f"--layouts: {text!r} leaves {' and '.join(growing)} without a size; "
                         f"at most one axis may grow")
    return Pattern(text, tuple(sizes.items()), growing[0] if growing else None)


def parse_series(text):
    patterns = [parse_pattern(part) for part in text.split("/")]
    if sum(p.grow is not None for p in patterns) > 1:
        raise UsageError(f"--layouts {text}: at most one layout of a series may grow")
    explicit = [p.block for p in patterns if p.grow is None]
    if len(explicit) != len(set(explicit)):
        raise UsageError(f"--layouts {text}: two layouts of the same size; give one per rank count")
    return Series(text, tuple(patterns))


def parse_layouts(text):
    """``--layouts``: the comma-separated series."""
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise UsageError(f"--layouts {text!r}: an empty series; write e.g. dp,tp or tp2dp")
    if len(set(names)) != len(names):
        raise UsageError(f"--layouts {text!r} names a series twice")
    return [parse_series(name) for name in names]


def parse_ranks(text):
    """``--ranks``: comma-separated rank counts, run from the smallest up."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise UsageError(f"--ranks {text!r}: give whole numbers of at least 1, separated by commas, e.g. 1,2,4,8")
    return sorted({int(part) for part in parts})


def global_batch(mode, batch, ranks):
    """Strong scaling: ``batch`` at every point.  Weak: ``batch`` per rank."""
    if mode not in MODES:
        raise UsageError(f"--mode must be strong or weak, not {mode!r}")
    return batch * ranks if mode == "weak" else batch


@dataclass(frozen=True)
class Point:
    mode: str
    series: Series
    ranks: int
    layout: Layout
    batch_size: int

    @property
    def name(self):
        """The file name (without suffix) of this point's result and log."""
        return f"{self.mode}-{self.series.slug}-n{self.ranks}"


def points(ranks, series, mode, batch):
    """Every point of the sweep, smallest rank count first; UsageError for one that cannot exist."""
    return [Point(mode, s, n, s.layout(n), global_batch(mode, batch, n)) for n in ranks for s in series]
