"""Mixed precision: which numbers live in which dtype, decided here and nowhere else.

``--precision fp32`` (the default) is plain float32 everywhere.  ``fp16`` and ``bf16`` follow what
mixed-precision training does in the common frameworks (Micikevicius et al. 2018; PyTorch AMP;
Megatron-LM):

    fp32   master weights (the buckets the optimizer updates), the optimizer state, the gradients
           (accumulated over micro-batches, reduced over data parallelism, clipped, unscaled)
    low    a compute copy of the weights, refreshed after each optimizer step; activations and the
           messages between pipeline stages; every GEMM's inputs and output
    fp32   inside the numerically sensitive steps: LayerNorm statistics, the attention softmax, GELU,
           the loss (cross-entropy or squared error), and tensor-parallel sums of activations

A GEMM takes low-precision inputs, accumulates in fp32 and rounds its output once: on a GPU that is
what cuBLAS does with fp16/bf16 tensor cores; on the CPU ``gemm`` emulates it (numpy has no fast fp16
GEMM and no bf16 at all: ``ml_dtypes.bfloat16`` supplies the dtype).  The CPU path is for correctness
and teaching - it is slower than fp32, and the numerics are the point.

FP8 and FP4 (``--precision fp8-tensorwise | fp8-rowwise | fp8-blockwise | mxfp8 | nvfp4``, hpcpar/fp8/):

    fp8/fp4  the inputs of the linear layers' GEMMs inside the blocks, quantised with the recipe's
             scales (the embedding, the output head and the MoE layers are not: they stay in the
             compute dtype, as in torchao, Transformer Engine and DeepSeek-V3), multiplied with fp32
             (or float64) accumulation, the output rounded once to the compute dtype
    rest     everything else: ``--fp8-rest fp32`` the master dtype (float32 or float64: then only the
             quantisation differs from a plain run), ``bf16`` the bf16 table above (the real recipe)

fp16 has 5 exponent bits: gradients below about 6e-8 flush to zero.  So the loss is multiplied by a
scale before the backward (``LossScaler``: start at 2^16, halve and skip the step when a gradient
overflows, double after ``growth_interval`` good steps), and the gradients are divided by it again in
fp32 before clipping and the update.  bf16 has fp32's exponent range and needs no scaling.
"""
import math

import numpy as np

from hpcpar.backend import array_module, is_device_array
from hpcpar.fp8.recipes import RECIPES
from hpcpar.runtime import UsageError

FP8 = tuple(RECIPES)                        # the quantised recipes (hpcpar/fp8/recipes.py)
PRECISIONS = ("fp32", "fp16", "bf16") + FP8


def elsewhere(precision, rest="fp32"):
    """The precision of every number but the quantised GEMMs' inputs: ``rest`` under a recipe (fp32:
    the master dtype), else ``precision`` itself."""
    return rest if precision in FP8 else precision


def bfloat16(xp):
    """``ml_dtypes.bfloat16`` if array module ``xp`` can hold it, else None.  numpy can (the dtype is
    ml_dtypes' extension); CuPy from v14 takes the same dtype (experimental), earlier ones cannot."""
    try:
        import ml_dtypes
    except ImportError:
        raise UsageError("--precision bf16 needs the ml_dtypes package: pip install ml_dtypes") from None
    dtype = np.dtype(ml_dtypes.bfloat16)
    if xp is np:
        return dtype
    try:
        xp.zeros(1, dtype=dtype)
        return dtype
    except (TypeError, ValueError, NotImplementedError):
        return None


def compute_dtype(precision, xp, master):
    """The dtype of activations and compute weights for ``precision`` on array module ``xp``."""
    if precision == "fp32":
        return np.dtype(master)
    if np.dtype(master) != np.float32:
        raise UsageError(f"--precision {precision} keeps float32 master weights: use --dtype float32")
    if precision == "fp16":
        return np.dtype(np.float16)
    bf16 = bfloat16(xp)
    if bf16 is None:
        raise UsageError("--precision bf16: this cupy has no bfloat16 (CuPy >= 14 with ml_dtypes has); "
                         "use --precision fp16")
    return bf16


def is_low(dtype):
    return np.dtype(dtype).itemsize == 2


def to_fp32(x):
    """x in float32 if it is in a low precision; otherwise x itself (no copy)."""
    return x.astype(np.float32) if is_low(x.dtype) else x


def accumulator(dtype):
    """The dtype to sum numbers of ``dtype`` in: float32 for the low precisions, else the dtype."""
    return np.dtype(np.float32) if is_low(dtype) else np.dtype(dtype)


def gemm(a, b, out=None):
    """a @ b.  Low-precision host arrays: multiplied in fp32, the result rounded once (the tensor-core
    contract, emulated); everything else: the array module's own matmul."""
    xp = array_module(a)
    if not is_low(a.dtype) or is_device_array(a):
        return xp.matmul(a, b, out=out)
    y = np.matmul(a.astype(np.float32), b.astype(np.float32))
    if out is None:
        return y.astype(a.dtype)
    out[...] = y
    return out


def summed_in_fp32(reduce, x):
    """Apply the in-place reduction ``reduce`` (an all-reduce) to x, summing in fp32 when x is low
    precision: one rounding whatever the number of ranks, and MPI has no bf16 sum."""
    if not is_low(x.dtype):
        return reduce(x)
    x32 = x.astype(np.float32)
    reduce(x32)
    x[...] = x32
    return x


def scattered_in_fp32(reduce_scatter, x):
    """``reduce_scatter(x)`` (returns a new array), summing in fp32 when x is low precision."""
    if not is_low(x.dtype):
        return reduce_scatter(x)
    return reduce_scatter(x.astype(np.float32)).astype(x.dtype)


class LossScaler:
    """Dynamic loss scaling (fp16).  ``scale`` multiplies the loss's gradient; ``update`` after each
    step: an overflow halves the scale (the step is skipped), ``growth_interval`` clean steps in a row
    double it.  With ``dynamic`` False the scale stays 1 (fp32, bf16)."""

    def __init__(self, dynamic, scale=2.0 ** 16, growth_interval=1000):
        self.dynamic = dynamic
        self.scale = scale if dynamic else 1.0
        self.growth_interval = growth_interval
        self.good_steps = 0

    def update(self, grads_finite):
        if not self.dynamic:
            return
        if not grads_finite:
            self.scale /= 2
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= 2
            self.good_steps = 0


def grads_overflowed(scaler, loss, norm):
    """A finite loss whose scaled gradients overflowed: loss scaling's business, not a diverged run."""
    return scaler.dynamic and math.isfinite(loss) and not math.isfinite(norm)


def allow_tf32(cupy, on=True):
    """``--tf32``: cuBLAS may multiply float32 matrices on TF32 tensor cores (10-bit mantissa inputs,
    fp32 accumulation) - CuPy's CUPY_TF32=1, set for this process.  Only float32 GEMMs change."""
    from cupy._core import _routines_linalg as linalg
    linalg.set_compute_type(cupy.float32, linalg.COMPUTE_TYPE_TF32 if on else linalg.COMPUTE_TYPE_DEFAULT)
