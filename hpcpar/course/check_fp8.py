"""Low-precision exercises (docs/precision.md): quantise a 1 x 128 tile to E4M3, the E8M0 scale of an MX
32-block, and which ranks' maxima make a sharded weight's amax (hpcpar/fp8)."""
import numpy as np

from hpcpar.comm.grid import AXES, GridLayout
from hpcpar.course.wrong import Wrong
from hpcpar.fp8.formats import E4M3
from hpcpar.fp8.layout import axes
from hpcpar.fp8.quantise import quantise
from hpcpar.fp8.recipes import Scaling

ORDER = "tp-cp-dp-pp"           # the grid of exercise 36: tp fastest, then cp, dp, pp


def quantise_tile(tile):
    """Reference: (the values an FP8 GEMM multiplies, the scale s) of one 1 x 128 tile of an activation row
    (or fewer values: the row's end) in E4M3: s = 448 / amax in fp32, the values round(t s) / s."""
    q = quantise(tile[None, :], Scaling("tile", E4M3, 128), 1)
    return q.values[0], float(q.scale.reshape(-1)[0])


def e8m0_exponent(block):
    """Reference: k of the E8M0 scale 2^k of an MX block of E4M3 values."""
    s = quantise(block[None, :], Scaling("mx", E4M3, 32), 1).scale
    return int(-np.log2(float(s.reshape(-1)[0])))


def amax_ranks(rank, sizes, layer, scaling, fp8_gather=False):
    """Reference: the ranks whose maxima make the amax of the forward GEMM's weight W on ``rank``."""
    k_axis, m_axis = axes(layer, "forward", "w")                 # W is (K, M), scaled along K
    group = {a for a in ((k_axis, m_axis) if scaling == "tensor" else (k_axis,)) if a}
    if fp8_gather:                                               # ZeRO-3's slices, quantised before the gather
        group |= {"dp", "cp"}
    world = int(np.prod(list(sizes.values())))
    grid = GridLayout(world, ORDER, **sizes)
    mine = grid.index(rank)
    return sorted(r for r in range(world) if all(grid.index(r)[a] == mine[a] for a in AXES if a not in group))


def _tiles():
    rng = np.random.default_rng(0)
    ties = np.zeros(128)
    ties[:6] = [448.0, 1.0625, 1.1875, -2.375, 0.0029296875, 0.0009765625]       # on the grid's midpoints
    return [("a tile of activations", rng.standard_normal(128)),
            ("a float32 tile", rng.standard_normal(128).astype(np.float32) * 3),
            ("the last 40 values of a row", rng.standard_normal(40)),
            ("values over eight decades", rng.standard_normal(128) * 10.0 ** rng.uniform(-8, 0, 128)),
            ("a tile with one outlier", np.r_[rng.standard_normal(127) * 1e-3, -50.0]),
            ("values halfway between two E4M3 numbers", ties),
            ("an all-zero tile", np.zeros(128))]


def check_quantise_tile(f):
    for what, tile in _tiles():
        want, want_s = quantise_tile(tile)
        got = f(tile.copy())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Wrong("return (the values, the scale s)")
        values, s = np.asarray(got[0], dtype=np.float64), float(got[1])
        if s != want_s and not (np.isnan(s) and np.isnan(want_s)):
            raise Wrong(f"{what} ({tile.dtype}): the scale is {s:.9g}, not 448 / amax rounded to fp32")
        if values.shape != want.shape:
            raise Wrong(f"{what}: {values.shape} values for a tile of {tile.size}")
        bad = np.flatnonzero(values != want)
        if bad.size:
            i = bad[0]
            raise Wrong(f"{what} ({tile.dtype}): value {i}, {tile[i]:.9g}, became {values[i]:.9g}, expected "
                        f"{want[i]:.9g}")


def check_e8m0_exponent(f):
    rng = np.random.default_rng(1)
    blocks = [("a block of activations", rng.standard_normal(32)),
              ("a float32 block of gradients", (rng.standard_normal(32) * 1e-5).astype(np.float32)),
              ("a block whose amax is exactly 448 x 2^3", np.r_[448.0 * 8, rng.uniform(-1, 1, 31)]),
              ("a block whose amax is a hair above 448 x 2^-2", np.r_[-112.0 * (1 + 2 ** -40), np.zeros(31)]),
              ("a block whose amax is 2^-20", np.r_[2.0 ** -20, np.zeros(31)]),
              ("a block of 1e-45s", np.full(32, 1e-45)),
              ("a block of 1e300s", np.full(32, 1e300)),
              ("an all-zero block", np.zeros(32))]
    for what, block in blocks:
        want, got = e8m0_exponent(block), f(block.copy())
        if not isinstance(got, (int, np.integer)):
            raise Wrong(f"{what}: return k as an integer, not {type(got).__name__}")
        if got != want:
            amax = float(np.abs(block).max())
            raise Wrong(f"{what} (amax {amax:.6g}): k = {got} is not the exponent the rule gives"
                        + (" (amax / 2^k beyond 448)" if amax / 2.0 ** got > 448 else ""))


GRIDS = [dict(tp=2, cp=1, dp=2, pp=2), dict(tp=4, cp=2, dp=1, pp=1), dict(tp=2, cp=2, dp=2, pp=1)]


def check_amax_ranks(f):
    for sizes in GRIDS:
        world = int(np.prod(list(sizes.values())))
        for layer in ("column", "row"):
            for scaling, gather in (("tensor", False), ("row", False), ("tensor", True)):
                for rank in range(world):
                    want = amax_ranks(rank, dict(sizes), layer, scaling, gather)
                    got = f(rank, dict(sizes), layer, scaling, gather)
                    if sorted(got) != want:
                        grid = " x ".join(f"{a} {n}" for a, n in sizes.items())
                        raise Wrong(f"{grid}, a {layer}-parallel layer's W scaled by {scaling}"
                                    + (", gathered in FP8 by ZeRO-3" if gather else "")
                                    + f": rank {rank} says {sorted(got)}, "
                                    + ("too many" if set(want) < set(got) else "not the right") + " ranks")
