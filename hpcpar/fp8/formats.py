"""The number formats of low-precision training, and rounding into them exactly as the hardware does.

    format  bits  sign exp mant  largest  smallest normal  smallest subnormal  used for
    E4M3      8    1    4   3       448        2^-6             2^-9           FP8 values (OCP "fn": no inf)
    E5M2      8    1    5   2     57344        2^-14            2^-16          FP8 gradients (TE's hybrid)
    E2M1      4    1    2   1         6        1                0.5            NVFP4 values: 0 .5 1 1.5 2 3 4 6
    E8M0      8    0    8   0     2^127        2^-127           -              MX block scales: powers of two

A value is rounded to the nearest representable one, ties to even (what the GPU's conversion
instructions do, saturating: a value beyond the largest becomes the largest, as torch's
``_to_fp8_saturated`` and the MX/NVFP4 quantisers clamp before converting).  ``round_to`` writes that
rounding with frexp and rint, on any array module (CuPy has no FP8 dtypes): for |y| >= 2^emin the
spacing of the format near y is 2^(floor(log2|y|) - mantissa bits), below it the subnormal spacing
2^(emin - mantissa bits), and rint(y / spacing) * spacing is the nearest multiple, ties to even -
exact, since y / spacing only moves the exponent.  ``convert`` is one conversion through ml_dtypes'
types, the formats' reference implementation: tests/test_fp8_quantise.py holds the two equal on every
value of each format, the ties between them and the values beyond; ``round_to`` is 2-5x faster.

ml_dtypes also gives the bit patterns (``codes``: the FP8 bytes --fp8-param-gather sends), so the FP8
and FP4 precisions need it: ``require`` refuses in one line when it is missing.
"""
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hpcpar.backend import array_module
from hpcpar.runtime import UsageError


@dataclass(frozen=True)
class Format:
    name: str          # e4m3, e5m2, e2m1, e8m0
    dtype_name: str    # the ml_dtypes type
    mantissa: int      # explicit mantissa bits
    emin: int          # exponent of the smallest normal
    max: float         # the largest finite value
    emax: int          # exponent of the largest power of two <= max (the OCP MX spec's emax_elem)

    @property
    def saturates_above(self):
        """Beyond this a value would round past the largest: saturation changes it (the largest plus
        half the spacing there; below it, rounding alone gives the largest)."""
        return self.max + 2.0 ** (self.emax - self.mantissa - 1)

    @property
    def smallest(self):
        """The smallest positive value (subnormal)."""
        return 2.0 ** (self.emin - self.mantissa)


E4M3 = Format("e4m3", "float8_e4m3fn", 3, -6, 448.0, 8)
E5M2 = Format("e5m2", "float8_e5m2", 2, -14, 57344.0, 15)
E2M1 = Format("e2m1", "float4_e2m1fn", 1, 0, 6.0, 2)
E8M0 = Format("e8m0", "float8_e8m0fnu", 0, -127, 2.0 ** 127, 127)
FORMATS = {f.name: f for f in (E4M3, E5M2, E2M1, E8M0)}


def require(what="these precisions"):
    """The ml_dtypes module, or one line saying how to get it."""
    try:
        import ml_dtypes
    except ImportError:
        raise UsageError(f"{what} need the ml_dtypes package (>= 0.5, with float8_e8m0fnu and float4_e2m1fn): "
                         f"pip install 'ml_dtypes>=0.5'") from None
    if not hasattr(ml_dtypes, "float4_e2m1fn"):
        raise UsageError(f"{what} need ml_dtypes >= 0.5 (this one, {ml_dtypes.__version__}, has no float4_e2m1fn): "
                         f"pip install -U ml_dtypes")
    return ml_dtypes


@lru_cache(maxsize=None)
def dtype(fmt):
    return np.dtype(getattr(require(), fmt.dtype_name))


def round_to(fmt, y):
    """y rounded to ``fmt`` (nearest, ties to even, saturating), in y's dtype, on any array module."""
    xp = array_module(y)
    _, e = xp.frexp(y)                                  # |y| = m 2^e, m in [0.5, 1): floor(log2|y|) = e - 1
    spacing = xp.ldexp(xp.ones_like(y), xp.maximum(e - 1, fmt.emin) - fmt.mantissa)
    return xp.clip(xp.rint(y / spacing) * spacing, -fmt.max, fmt.max)


def convert(fmt, y):
    """The same through ml_dtypes' conversion (numpy): the reference ``round_to`` is tested against."""
    return np.clip(y, -fmt.max, fmt.max).astype(dtype(fmt)).astype(y.dtype)


def codes(fmt, y):
    """The bit patterns (uint8) of y, already representable in ``fmt``: what would travel or be stored."""
    return np.ascontiguousarray(y).astype(dtype(fmt)).view(np.uint8)


def from_codes(fmt, c, out_dtype):
    return c.view(dtype(fmt)).astype(out_dtype)


def power_of_two_below(x):
    """2^floor(log2 x) for x > 0 (exact: frexp reads the exponent)."""
    xp = array_module(x)
    _, e = xp.frexp(x)
    return xp.ldexp(xp.ones_like(x), e - 1)
