"""Cache blocking: run a chain of elementwise passes block by block instead of array by array.

GELU's forward is ten in-place passes over an activation of (B*T, 4C) numbers - megabytes, more than
a core's L2 cache holds - so done array by array, every pass streams the whole array from memory
again.  Cut the rows into blocks of about ``BLOCK_BYTES`` and run the whole chain on one block before
the next: the block stays in L2 from the first pass to the last, and memory sees each element about
once.  Each element still goes through the same operations in the same order, so the results are
bit for bit those of the unblocked chain; only the loop order changes.  (A fused GPU kernel or a C
loop gets this for free; in numpy a Python loop over blocks is how to get it.)

On a GPU one kernel launch per pass over the whole array is what is fast: there one block holds
everything.
"""
from hpcpar.backend import is_device_array

# A chain touches 3 to 5 arrays at once; blocks of 256 KB keep them all inside a 2 MB L2.  Measured
# on the benchmark machine (GELU, docs/performance.md): 256 KB was best, 128 and 512 KB within about
# 15%, 64 KB pays for its Python loop and 1 MB no longer fits.
BLOCK_BYTES = 256 * 1024


def row_blocks(*arrays, block_bytes=BLOCK_BYTES):
    """Yield, block after block, a tuple holding each array's rows of that block.

    Leading dimensions are flattened into rows, (..., n) -> (rows, n); every array has the leading
    dimensions of the first (its last may differ: a per-row statistic of shape (..., 1)).  An array
    written into must flatten to rows without a copy, or the writes would land in the copy: any
    two-dimensional array does (the strided half of a wider one included), and any C-contiguous one;
    an input may be any layout.
    """
    flat = [a.reshape(-1, a.shape[-1]) for a in arrays]
    rows = flat[0].shape[0]
    row_bytes = max(1, flat[0].shape[1] * flat[0].itemsize)
    step = rows if is_device_array(arrays[0]) else max(1, block_bytes // row_bytes)
    for start in range(0, rows, step):
        yield tuple(a[start:start + step] for a in flat)
