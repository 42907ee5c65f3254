"""Quantising one GEMM operand: the amax of each piece, its scale, the values rounded - pure functions.

An operand t (R, L) - R rows, L along the contraction (the caller transposes an operand whose
contraction is its first axis) - is cut into pieces that share one scale (recipes.py: the whole
tensor, a row, a 1 x B tile, a B x B block).  For each piece:

    amax = max |t| over the piece                (and over the ranks holding other parts of it: ``groups``)
    s    = fmt.max / amax                       the multiplier that sends amax to the format's largest
    q    = round(t s)                           to the format, nearest and ties to even, saturating
    t'   = q / s                                what the GEMM multiplies: t's values on the format's grid

so the largest value of each piece lands on the format's largest, and everything below it keeps the
format's relative precision until it falls below the smallest subnormal and flushes to zero.  The
scales differ per recipe only in how they are rounded: an fp32 number (tensor, tile, block), a power
of two (torchao's rowwise rounds s down: dividing by it is exact), an E8M0 power of two per 32-piece
(MX: the smallest 2^k with amax / 2^k <= fmt.max, NVIDIA's "RCEIL"; OCP's spec rounds the exponent
down instead and lets the top values saturate), or two levels (NVFP4: an fp32 scale of the tensor,
s_t = 6 * 448 / amax_t, and per 16-piece an E4M3 decode scale d = e4m3(amax / 6 * s_t), the values
multiplied by s_t / d).  The scales are fp32, as on the GPU; the products are formed in t's dtype.

``groups``: for each of the operand's two axes, a function that turns this rank's amax (an array) into
the maximum over every rank holding another part of that axis, or None when the axis is whole here
(training/low_precision.py passes the tensor- and context-parallel groups).  A row's amax is reduced
over the contraction's group, a tensor's over both; tiles and blocks never straddle two ranks (the
layouts where they would are refused: fp8/layout.py), so theirs is local.  Hence every layout
computes the scales one rank computes.

Besides the values: what the rounding cost (``Figures``): the squared error and the squared values
(their ratio is the relative error), how many values saturated (|t s| beyond the largest value and half
a spacing: only with delayed scaling, or a clamped scale), how many nonzero values flushed to zero, the range of the decode scales
(what a code is multiplied by: 1 / s), the amax.
"""
from dataclasses import dataclass

import numpy as np

from hpcpar.backend import array_module
from hpcpar.fp8.formats import E4M3, E8M0, round_to

EPS = 1e-12             # an all-zero piece: its amax taken as this (torchao's), so the scale stays finite


@dataclass
class Figures:
    err2: float = 0.0       # sum of (t' - t)^2
    ref2: float = 0.0       # sum of t^2
    n: int = 0              # values
    overflow: int = 0       # values beyond the format's largest, saturated
    flushed: int = 0        # nonzero values rounded to zero
    scale_lo: float = np.inf    # smallest and largest decode scale (a code times it is the value)
    scale_hi: float = 0.0
    amax: float = 0.0
    clamped: int = 0        # scales that left their own format's range (E8M0, NVFP4's E4M3 block scales)

    def add(self, other):
        for name in ("err2", "ref2", "n", "overflow", "flushed", "clamped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.scale_lo, self.scale_hi = min(self.scale_lo, other.scale_lo), max(self.scale_hi, other.scale_hi)
        self.amax = max(self.amax, other.amax)
        return self


@dataclass
class Quantised:
    values: object          # t' (the operand's shape, t's dtype): what the GEMM multiplies
    q: object               # the rounded scaled values t s (the codes' values), the operand's shape
    scale: object           # the multipliers s, broadcastable to t (R, L) orientation
    figures: Figures


def quantise(a, scaling, contraction, groups=(None, None), segment=0, amax=None):
    """Quantise the 2-D operand ``a`` whose axis ``contraction`` (0 or 1) the GEMM sums over.
    ``segment``: pieces along the contraction stay within runs of this many (the sequences of a
    token axis); ``amax``: a given amax (delayed scaling) instead of the tensor's own."""
    t = a if contraction == 1 else a.T                  # (R, L): L along the contraction
    along, across = groups[contraction], groups[1 - contraction]
    kind = scaling.kind
    if kind in ("tensor", "row"):
        mag = abs(t).max(axis=1, keepdims=True) if kind == "row" else abs(t).max(keepdims=True)
        if amax is None:
            mag = _reduce(mag, along, across if kind == "tensor" else None)
        s = fp8_scale(mag if amax is None else array_module(t).full((1, 1), amax), scaling.fmt, scaling.pow2)
        decode, clamped = 1 / s, 0
    elif kind == "nvfp4":
        s, decode, clamped, mag = _nvfp4_scales(t, scaling, segment, along, across)
    else:
        mag = _amax(t, scaling, segment)
        if kind == "mx":
            s, clamped = _e8m0_scale(mag, scaling)
        else:
            s, clamped = fp8_scale(mag, scaling.fmt, scaling.pow2), 0
        decode = 1 / s
        s = _spread(s, t.shape, scaling, segment)
    y = t * s.astype(t.dtype)
    q = round_to(scaling.fmt, y)
    values = q / s.astype(t.dtype) if kind != "nvfp4" else q * _spread(decode, t.shape, scaling, segment)
    figures = _figures(t, values, y, q, scaling, decode, mag, clamped)
    back = (lambda m: m) if contraction == 1 else (lambda m: m.T)
    return Quantised(back(values), back(q), s, figures)


def _reduce(mag, along, across):
    for group in (along, across):
        if group is not None:
            mag = group(mag)
    return mag


def fp8_scale(mag, fmt, pow2=False):
    """s = fmt.max / amax in fp32 (computed in float64 first, as torchao does), a power of two below it
    for ``pow2``."""
    xp = array_module(mag)
    s = (fmt.max / xp.maximum(mag.astype(np.float64), EPS)).astype(np.float32)
    if pow2:
        _, e = xp.frexp(s)
        s = xp.ldexp(xp.ones_like(s), e - 1)
    return s


def _e8m0_scale(mag, scaling):
    """s = 1 / 2^k, 2^k the smallest power of two with amax / 2^k <= fmt.max, k within E8M0's [-127, 127].
    Returns (s, how many k were clamped)."""
    xp = array_module(mag)
    ratio = xp.maximum(mag.astype(np.float64), 2.0 ** -200) / scaling.fmt.max
    m, e = xp.frexp(ratio)                                      # ratio = m 2^e, m in [0.5, 1)
    k = e - (m == 0.5)                                          # ceil(log2 ratio)
    kept = xp.clip(k, E8M0.emin, E8M0.emax)
    clamped = int(((kept != k) & (mag > 0)).sum())
    return xp.ldexp(xp.ones(k.shape, np.float32), -kept), clamped


def _nvfp4_scales(t, scaling, segment, along, across):
    """(s per value, the decode scales d / s_t per piece, clamped, the pieces' amax) of NVFP4's two levels."""
    xp = array_module(t)
    top = _reduce(abs(t).max(keepdims=True), along, across).astype(np.float64)
    s_t = xp.where(top > 0, E4M3.max * scaling.fmt.max / xp.maximum(top, EPS), 1.0).astype(np.float32)
    mag = _amax(t, scaling, segment)
    d = round_to(E4M3, (mag.astype(np.float32) / scaling.fmt.max) * s_t.reshape((1,) * mag.ndim))
    clamped = int(((d == 0) & (mag > 0)).sum())                 # a block scale below E4M3's smallest: flushed
    s_piece = xp.where(d > 0, s_t.reshape((1,) * mag.ndim) / xp.where(d > 0, d, 1), 0).astype(np.float32)
    return _spread(s_piece, t.shape, scaling, segment), d / s_t.reshape((1,) * d.ndim), clamped, mag


def _amax(t, scaling, segment):
    """The amax of every piece: (R, runs, pieces) for 1 x B pieces along L within runs of ``segment``;
    (R pieces, L pieces) for B x B blocks."""
    xp = array_module(t)
    R, L = t.shape
    B = scaling.block
    if scaling.kind == "block" or scaling.square:
        padded = xp.zeros((-(-R // B) * B, -(-L // B) * B), dtype=t.dtype)
        padded[:R, :L] = abs(t)
        return padded.reshape(padded.shape[0] // B, B, padded.shape[1] // B, B).max(axis=(1, 3))
    S = segment or L
    runs = abs(t).reshape(R, L // S, S)
    pad = (-S) % B
    if pad:
        runs = xp.concatenate([runs, xp.zeros((R, L // S, pad), dtype=t.dtype)], axis=2)
    return runs.reshape(R, L // S, -1, B).max(axis=3)


def _spread(s, shape, scaling, segment):
    """Per-piece numbers back to one per value, (R, L)."""
    xp = array_module(s)
    R, L = shape
    B = scaling.block
    if scaling.kind == "block" or scaling.square:
        return xp.repeat(xp.repeat(s, B, axis=0)[:R], B, axis=1)[:, :L]
    S = segment or L
    return xp.repeat(s, B, axis=2)[:, :, :S].reshape(R, L)


def _figures(t, values, y, q, scaling, decode, mag, clamped):
    xp = array_module(t)
    err = (values - t).ravel()
    flat = t.ravel()
    return Figures(err2=float(xp.vdot(err, err)), ref2=float(xp.vdot(flat, flat)), n=int(t.size),
                   overflow=int(xp.count_nonzero(abs(y) > scaling.fmt.saturates_above)),
                   flushed=int(xp.count_nonzero(t) - xp.count_nonzero(q)),        # q != 0 only where t != 0
                   scale_lo=float(decode.min()), scale_hi=float(decode.max()), amax=float(mag.max()),
                   clamped=clamped)
