"""Exercise 34 (docs/course/11-mixed-precision.md): quantise a 1 x 128 tile to FP8 (E4M3).

DeepSeek-V3's blockwise recipe scales each 1 x 128 tile of an activation row on its own.  Given one
tile (128 numbers, or fewer at the end of a row; float32 or float64), return

    (the values the FP8 GEMM multiplies, the scale s)

with s = 448 / amax (amax: the largest |value| of the tile, 1e-12 for a tile of zeros), computed in
float64 and stored as an fp32 number, as the GPU holds it; each value t becomes round(t s) / s, where
round gives the nearest E4M3 number (ties to the even mantissa, subnormals down to 2^-9 included,
nothing beyond 448), and the values stay in the tile's dtype.  E4M3: 4 exponent bits, 3 mantissa bits;
ml_dtypes.float8_e4m3fn is the format, if you want it.

Check: .venv/bin/hpcpar course check 34
"""


def quantise_tile(tile):
    raise NotImplementedError
