"""A C GEMM called on numpy arrays through ctypes: strides become transposes and leading dimensions.

Every library here has the row-major BLAS interface

    C = alpha op(A) op(B) + beta C      op(X) = X or X^T,  A (M, K), B (K, N), C (M, N) after op

in some dtype (float32, or bfloat16/float16 inputs with float32 C).  A numpy matrix fits it without a
copy when one of its strides is the element size: rows of stride ``ld`` elements (op = N, leading
dimension ld) or columns of that stride, i.e. the transpose of a row-major matrix (op = T) - which is
what ``w.T`` and ``k.transpose(0, 1, 3, 2)`` are.  Anything else is copied first.  C is written in
place when its rows are contiguous, else through a temporary.

Batched products (attention's (B, NH, T, HS) blocks) are a loop over the batch in Python: one call per
matrix, pointers advanced by the batch strides (a broadcast batch dimension has stride 0).
"""
import ctypes

import numpy as np

P, F = ctypes.c_void_p, ctypes.c_float


def layout(x):
    """(array, transposed, ld) for a 2D view x (..., R, C): x itself when one stride is unit, else a copy."""
    item = x.itemsize
    r, c = x.shape[-2:]
    sr, sc = x.strides[-2:]
    if c == 1 or sc == item:                          # rows of ld elements (a one-column matrix: any sr)
        ld = sr // item if r > 1 else c
        if sr % item == 0 and ld >= max(1, c):
            return x, False, ld
    if r == 1 or sr == item:                          # columns of ld elements: the transpose of row-major
        ld = sc // item if c > 1 else r
        if sc % item == 0 and ld >= max(1, r):
            return x, True, ld
    return np.ascontiguousarray(x), False, c


class Kernel:
    """One C function ``fn(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)`` (row-major)
    with its flag encoding, taking numpy arrays of ``dtype`` and giving float32."""

    def __init__(self, fn, dtype, flags, prefix=()):
        self.fn, self.dtype, self.flags = fn, np.dtype(dtype), flags     # flags: {False: N, True: T}
        self.prefix = prefix                                                # leading arguments (CBLAS's layout)

    def __call__(self, a, b, out, add=False):
        """out[...] = a @ b (``add``: out += a @ b) for a (..., M, K), b (..., K, N) of self.dtype; out
        float32 (..., M, N)."""
        a, ta, lda = layout(a)
        b, tb, ldb = layout(b)
        M, K = a.shape[-2:]
        N = b.shape[-1]
        direct = out.strides[-1] == 4 and (M < 2 or (out.strides[-2] % 4 == 0 and out.strides[-2] >= 4 * N))
        c = out if direct else np.empty(out.shape, np.float32)
        ldc = c.strides[-2] // 4 if M > 1 else N
        beta = 1.0 if add and direct else 0.0                      # C = A B + beta C
        batch = c.shape[:-2]
        if K == 0 or c.size == 0:                                  # an empty sum
            if not beta:
                c[...] = 0
        elif not batch:
            _check(self.fn(*self.prefix, self.flags[ta], self.flags[tb], M, N, K, 1.0, a.ctypes.data, lda,
                           b.ctypes.data, ldb, beta, c.ctypes.data, ldc))
        else:
            index = np.indices(batch).reshape(len(batch), -1).T                # (matrices, batch dims)
            pa, pb, pc = ((x.ctypes.data + index @ _batch_strides(x, batch)).tolist() for x in (a, b, c))
            head, fn = self.prefix + (self.flags[ta], self.flags[tb], M, N, K, 1.0), self.fn
            for xa, xb, xc in zip(pa, pb, pc):
                _check(fn(*head, xa, lda, xb, ldb, beta, xc, ldc))
        if not direct:
            if add:
                out += c
            else:
                out[...] = c
        return out


def _check(status):
    """CBLAS returns nothing; oneDNN a status, 0 for success."""
    if status:
        raise RuntimeError(f"the GEMM library returned status {status}")


def _batch_strides(x, batch):
    """x's byte strides over the batch dimensions ``batch`` (right-aligned; 0 where x broadcasts)."""
    lead = x.shape[:-2]
    return np.array([0] * (len(batch) - len(lead)) + [s if n > 1 else 0 for n, s in zip(lead, x.strides[:-2])],
                    dtype=np.int64)


def bind(lib, symbol, flag_type, int_type, prefix=(), restype=None):
    """lib.symbol with the row-major GEMM argument types; ``prefix``: the ctypes types of leading fixed
    arguments (CBLAS's layout)."""
    fn = getattr(lib, symbol)
    fn.restype = restype
    fn.argtypes = list(prefix) + [flag_type, flag_type, int_type, int_type, int_type, F, P, int_type, P, int_type,
                                  F, P, int_type]
    return fn
