"""Exercise 35 (docs/course/11-mixed-precision.md): pick the E8M0 scale of an MX block.

MXFP8 shares one scale among 32 consecutive values, and the scale is a power of two, 2^k, stored in
E8M0 (8 exponent bits, nothing else: k from -127 to 127).  Each value is divided by 2^k and rounded to
E4M3, whose largest number is 448.  Return k (an int) for the block: the smallest k for which no value
of the block, divided by 2^k, goes beyond 448 - so that nothing saturates - kept within E8M0's range.
The block is a float32 or float64 array of 32 numbers.

Check: .venv/bin/hpcpar course check 35
"""


def e8m0_exponent(block):
    raise NotImplementedError
