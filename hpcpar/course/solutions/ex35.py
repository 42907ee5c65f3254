"""Exercise 35, a solution: the E8M0 scale of an MX block."""
import math

import numpy as np


def e8m0_exponent(block):
    amax = float(np.abs(block).max())
    if amax == 0:
        return -127
    k = math.ceil(math.log2(amax / 448))
    while amax / 2.0 ** (k - 1) <= 448:        # log2's rounding, near an exact power of two
        k -= 1
    while amax / 2.0 ** k > 448:
        k += 1
    return max(-127, min(127, k))
