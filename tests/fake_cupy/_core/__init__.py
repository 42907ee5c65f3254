"""``cupy._core`` of the stand-in: only what hpcpar reaches into (the GEMM compute type)."""
