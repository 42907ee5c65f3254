"""Exercise 43, a solution: each block is orthogonal, O_r O_r^T = I (4 x 4), so the whole gives
[O_0 | ... ] [O_0 | ... ]^T = sum_r O_r O_r^T = tp I: every singular value sqrt(tp)."""

ANSWER = (2 ** 0.5, 2.0)
