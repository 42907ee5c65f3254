"""Mixed precision: which numbers live in which dtype, decided here and nowhere else.

``--precision fp32`` (the default) is plain float32 everywhere.  ``fp16`` and ``bf16`` follow what
mixed-precision training does in the common frameworks (Micikevicius et al. 2018; PyTorch AMP;
Megatron-LM):

    fp32   master weights (the buckets the optimizer updates), the optimizer state, the gradients
           (accumulated over micro-batches, reduced over data parallelism, clipped, unscaled)
    low    a compute copy of the weights, refreshed after each optimizer step; activations, those kept
           for the backward included, and the messages between pipeline stages; every GEMM's inputs
    fp32   every GEMM's accumulation; inside the numerically sensitive steps: LayerNorm statistics,
           the attention softmax, GELU, the loss (cross-entropy or squared error), and tensor-parallel
           sums of activations

A GEMM takes low-precision inputs, accumulates in fp32 and rounds its sum once where it is stored in
the low precision.  Where an fp32 step follows, the sum goes on unrounded (``gemm(..., dtype=float32)``
or an fp32 ``out``): a linear layer's bias, the MLP's GELU, attention's scores S = Q K^T and dP, the
logits, and weight and bias gradients, which the GEMM adds straight into the fp32 gradients - the
epilogues of cuBLASLt and of llm.c's kernels.  On a GPU the product is cuBLAS's on the tensor cores; on
the CPU the run's GEMM provider's (hpcpar/blas: oneMKL or oneDNN on a CPU with bf16 units - AMX,
AVX512-BF16 - else numpy's fp32 BLAS on the inputs cast to fp32: the same numbers to fp32 round-off;
``ml_dtypes.bfloat16`` supplies the dtype).

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

from hpcpar import blas
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


def gemm(a, b, out=None, add=False, dtype=None):
    """a @ b, through the run's GEMM provider on the host (hpcpar/blas), CuPy's on a GPU.

    Low-precision inputs are multiplied with fp32 accumulation and the result rounded once to their
    dtype - or kept in fp32 when ``out`` is an fp32 array or ``dtype`` is float32 (the sum goes on into
    an fp32 op: a bias, GELU, a softmax; on a GPU cuBLAS's rounded output is widened).  ``add``:
    out += a @ b (a gradient accumulated in its own dtype; a BLAS does it inside the GEMM, C = A B + C).
    float64: numpy's own matmul."""
    if out is None and dtype is not None and np.dtype(dtype) == np.float32 and is_low(a.dtype) \
            and not is_device_array(a):
        out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), np.float32)
    if is_device_array(a) or a.dtype == np.float64:
        xp = array_module(a)
        if add:
            out += xp.matmul(a, b)
            return out
        y = xp.matmul(a, b, out=out)
        return y if dtype is None else y.astype(dtype, copy=False)
    keep = out is not None and out.dtype == np.float32
    if add and not keep:
        raise ValueError("gemm(add=True) accumulates into an fp32 or float64 out")
    y = blas.provider().matmul(a, b, out if keep else None, add)      # the fp32 accumulator
    if keep or not is_low(a.dtype):
        return y
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
