"""Low-precision training: number formats, quantisers, recipes and quantised GEMMs (docs/precision.md).

    formats.py   E4M3, E5M2, E2M1, E8M0 and rounding into them (ml_dtypes, or frexp/rint on any array module)
    quantise.py  one operand: amax per piece, scales, values rounded, what it cost (pure functions)
    recipes.py   the recipes as data: each operand's scaling and format in each of the three GEMMs
    layout.py    which ranks hold a piece of an operand; the layouts a piece would straddle, refused
    gemm.py      a linear layer's three GEMMs, quantised, through precision.gemm; delayed scaling
    stats.py     the figures merged over ranks, the table, the warnings
"""
