"""The number formats, the quantisers and the quantised GEMMs of hpcpar/fp8 on their own."""
import numpy as np
import pytest

from hpcpar.fp8.formats import E2M1, E4M3, E5M2, FORMATS, convert, dtype as dtype_of, round_to
from hpcpar.fp8.gemm import AmaxHistory, QuantisedGemms, limited_gemm
from hpcpar.fp8.quantise import Figures, quantise
from hpcpar.fp8.recipes import RECIPES, Scaling, high_precision_blocks, with_block
from hpcpar.fp8 import stats

ELEMENTS = [E4M3, E5M2, E2M1]


def values(fmt, dtype):
    """Random magnitudes over the format's whole range and beyond, every representable value, and the
    midpoints between neighbours (the ties), with both signs."""
    rng = np.random.default_rng(0)
    every = np.arange(256, dtype=np.uint8).view(dtype_of(fmt)).astype(np.float64)      # every bit pattern
    grid = np.unique(every[np.isfinite(every) & (np.abs(every) <= fmt.max)])
    mids = (grid[1:] + grid[:-1]) / 2
    wide = np.exp2(rng.uniform(fmt.emin - fmt.mantissa - 4, np.log2(fmt.max) + 2, 4000)) * rng.choice([-1, 1], 4000)
    return np.concatenate([grid, mids, wide, [0.0, fmt.max, fmt.smallest / 2, fmt.smallest * 0.51]]).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", ELEMENTS, ids=[f.name for f in ELEMENTS])
def test_rounding_by_exponent_is_ml_dtypes_conversion(fmt, dtype):
    """The arithmetic rounding equals ml_dtypes' conversion, ties to even and saturation included."""
    y = values(fmt, dtype)
    assert len(np.unique(np.abs(y[:2 ** 8]))) >= {"e2m1": 8, "e4m3": 127, "e5m2": 124}[fmt.name]
    want = convert(fmt, y)
    np.testing.assert_array_equal(round_to(fmt, y), want)
    assert np.abs(want).max() == fmt.max


def test_format_table():
    assert [(f.max, f.smallest) for f in (E4M3, E5M2, E2M1)] == [(448.0, 2.0 ** -9), (57344.0, 2.0 ** -16), (6.0, 0.5)]
    assert sorted(np.unique(np.abs(round_to(E2M1, np.linspace(-7, 7, 1001))))) == [0, .5, 1, 1.5, 2, 3, 4, 6]
    assert FORMATS["e8m0"].emax == 127


def rng_matrix(shape, seed=1, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_tensorwise_sends_the_amax_to_the_largest_value():
    a = rng_matrix((8, 40))
    q = quantise(a, Scaling("tensor", E4M3), 1)
    assert q.scale.shape == (1, 1) and np.abs(q.q).max() == 448.0
    np.testing.assert_allclose(q.values, a, rtol=2.0 ** -4, atol=np.abs(a).max() / 448 * 2.0 ** -9)
    assert q.figures.n == a.size and q.figures.overflow == 0


def test_rowwise_scales_are_powers_of_two_along_the_contraction():
    a = rng_matrix((8, 40)) * np.arange(1, 9)[:, None]
    q = quantise(a, Scaling("row", E4M3, pow2=True), 1)
    assert q.scale.shape == (8, 1) and np.all(np.log2(q.scale) == np.round(np.log2(q.scale)))
    top = np.abs(q.q).max(axis=1)
    assert np.all((top >= 224) & (top <= 448))                  # a power of two: the amax lands in the top binade
    qt = quantise(a.T, Scaling("row", E4M3, pow2=True), 0)      # contraction first: the same numbers
    np.testing.assert_array_equal(qt.values, q.values.T)


def test_tiles_stay_within_their_sequence():
    """Weight GEMM: pieces of 4 along 2 sequences of 6 tokens: [0,4) [4,6) | [6,10) [10,12)."""
    a = np.ones((1, 12))
    a[0, 7] = 100.0                                             # only the second sequence's first tile sees it
    q = quantise(a, Scaling("tile", E4M3, 4), 1, segment=6)
    decode = 1 / q.scale
    assert np.allclose(decode[0, :6], 1 / 448) and np.allclose(decode[0, 6:10], 100 / 448)
    assert np.allclose(decode[0, 10:], 1 / 448)


def test_square_blocks_and_mx_scales():
    a = rng_matrix((40, 40))
    a[:16, :16] *= 1000
    q = quantise(a, Scaling("block", E4M3, 16), 0)
    assert np.isclose(1 / q.scale[0, 0], np.abs(a[:16, :16]).max() / 448)
    assert np.isclose(1 / q.scale[39, 39], np.abs(a[32:, 32:]).max() / 448)
    mx = quantise(rng_matrix((40, 64)), Scaling("mx", E4M3, 32), 1)
    k = -np.log2(mx.scale)                                      # E8M0: the scale 2^k, an integer k
    assert np.all(k == np.round(k))
    pieces = np.abs(mx.q).reshape(40, 2, 32).max(axis=2)
    assert np.all((pieces >= 224) & (pieces <= 448))           # the smallest 2^k that brings amax below 448


def test_nvfp4_two_levels():
    a = rng_matrix((4, 32))
    q = quantise(a, Scaling("nvfp4", E2M1, 16), 1)
    s_t = np.float32(448 * 6 / np.abs(a).max())                 # the tensor's fp32 scale
    d = round_to(E4M3, np.abs(a).reshape(4, 2, 16).max(axis=2).astype(np.float32) / 6 * s_t)   # E4M3 per piece
    assert set(np.unique(np.abs(q.q))) <= {0, .5, 1, 1.5, 2, 3, 4, 6}
    np.testing.assert_array_equal(q.values, q.q * np.repeat(d / s_t, 16, axis=1))


def test_the_amax_is_reduced_over_the_groups_given():
    """A row's amax over the contraction's group only; a tensor's over both (here: doubled, to see)."""
    a = rng_matrix((4, 8))
    seen = []

    def group(name):
        return lambda m: seen.append((name, m.shape)) or m * 2
    quantise(a, Scaling("row", E4M3), 1, (group("rows"), group("contraction")))
    quantise(a, Scaling("tensor", E4M3), 0, (group("contraction"), group("cols")))
    assert seen == [("contraction", (4, 1)), ("contraction", (1, 1)), ("cols", (1, 1))]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_quantised_gemm_multiplies_the_quantised_operands(name):
    recipe = with_block(RECIPES[name], 8) if name == "fp8-blockwise" else RECIPES[name]
    x, w, dy = rng_matrix((32, 64)), rng_matrix((64, 48), 2), rng_matrix((32, 48), 3)
    mm = QuantisedGemms(recipe)
    y = mm("forward", x, w)
    want = quantise(x, recipe.x, 1).values @ quantise(w, recipe.w, 0).values
    np.testing.assert_allclose(y, want, rtol=1e-13)
    dw = mm("weight", x.T, dy, segment=16)
    np.testing.assert_allclose(dw, quantise(x.T, recipe.x, 1, segment=16).values
                               @ quantise(dy, recipe.dy, 0, segment=16).values, rtol=1e-13)
    assert 0 < np.linalg.norm(y - x @ w) / np.linalg.norm(x @ w) < (0.2 if name == "nvfp4" else 0.06)
    figures = mm.take_figures()
    assert sorted(figures) == [("forward", "w"), ("forward", "x"), ("weight", "dy"), ("weight", "x")]
    assert mm.take_figures() == {}


def test_delayed_scaling_uses_the_history_and_warns_when_it_saturates():
    history = AmaxHistory(2)
    mm = QuantisedGemms(RECIPES["fp8-tensorwise"], history=history)
    x, w = rng_matrix((8, 16)), rng_matrix((16, 8), 2) / 100
    mm("forward", x, w)                                         # no history: scale 1
    assert mm.figures[("forward", "w")].flushed > 0             # weights of 0.01 unscaled: below E4M3's normals
    for key in history.keys():
        history.push(key, history.pending[key])
    history.pending.clear()
    mm.take_figures()
    mm("forward", 3 * x, w)                                     # an amax three times the history's
    merged = stats.merge([{"h.0.attn.c_attn": mm.take_figures()}])
    assert merged["h.0.attn.c_attn"][("forward", "x")].overflow > 0
    seen = set()
    lines = stats.warnings(merged, seen)
    assert lines == [lines[0]] and "h.0.attn.c_attn forward GEMM, x:" in lines[0] and "saturated" in lines[0]
    assert stats.warnings(merged, seen) == []                   # once


def test_limited_accumulator_and_promotion():
    """DeepSeek-V3's point: ~14 bits of running sum lose a visible share of a long K; promoting every
    128 elements into fp32 wins most of it back; a wide accumulator is the plain GEMM."""
    a, b = np.abs(rng_matrix((16, 4096), dtype=np.float32)), np.abs(rng_matrix((4096, 16), 2, np.float32))
    exact = a.astype(np.float64) @ b
    err = {p: np.abs(limited_gemm(a, b, 14, p) - exact).max() / exact.max() for p in (0, 128)}
    assert err[0] > 4 * err[128] and err[0] > 1e-4
    np.testing.assert_allclose(limited_gemm(a, b, 30, 0), exact, rtol=1e-6)


def test_nvfp4_keeps_the_last_blocks_in_high_precision():
    assert high_precision_blocks(RECIPES["nvfp4"], 62) == set(range(52, 62))
    assert high_precision_blocks(RECIPES["nvfp4"], 2) == {1}
    assert high_precision_blocks(RECIPES["mxfp8"], 2) == set()


def test_the_report_merges_ranks_into_one_relative_error():
    f1, f2 = Figures(err2=1.0, ref2=100.0, n=10, flushed=1), Figures(err2=3.0, ref2=300.0, n=30, overflow=3)
    merged = stats.merge([{"a": {("forward", "x"): f1}}, {"a": {("forward", "x"): f2}}])
    row = stats.row(merged["a"][("forward", "x")])
    assert row["rel_err"] == pytest.approx(0.1) and row["saturated"] == 3 / 40 and row["flushed"] == 1 / 40
    table = stats.table("fp8-rowwise", {"x": "e4m3 row", "w": "e4m3 row", "dy": "e4m3 row"}, merged)
    assert "  a                      forward  x        e4m3 row" in table and "10.000%" in table
