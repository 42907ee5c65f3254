"""The routed half of a mixture of experts: the permutation, the grouped GEMM, the weighted combine.

Shapes: N tokens, k choices per token, E experts, C model width, F an expert's width,
M <= N k the assignments kept (the rows of the expert batch).

Assignment a = t k + j is token t's j-th choice, going to expert idx[t, j] (ops/router.py).

    order, offsets = route_order(idx, E, capacity)
        order (M,)      the kept assignments, expert by expert: a stable sort of idx by expert, so
                        each expert's rows are contiguous, in token order within an expert
        offsets (E+1,)  expert e's rows are order[offsets[e] : offsets[e + 1]]
        With a capacity, expert e keeps its first ``capacity`` assignments (token order, as the
        Switch Transformer drops) and the rest are dropped: their token gets nothing from that expert.

    dispatch   xs = x[order // k]                                   x (N, C) -> xs (M, C)
    backward   dx[t] = sum of dxs over the rows of token t's kept assignments

    grouped    ys[rows of e] = xs[rows of e] W_e (+ b_e)           xs (M, in), W (E, in, out) -> (M, out)
    backward   dxs[rows of e] = dys[rows of e] W_e^T;   dW_e = xs[rows of e]^T dys[rows of e];   db_e = sum rows

    combine    y[t] = sum_j w[t, j] ye[row of (t, j)]               ye (M, C), w (N, k) -> y (N, C)
    backward   dye[row of a] = w_a dy[t];   dw_a = dy[t] . ye[row of a]   (0 for a dropped a)

This is the shape expert parallelism dispatches in: ``order`` groups rows by expert, and experts held
by one rank are a contiguous run of them, so the rows for each rank are one slice of xs.

The sums over a token's k rows go through a dense (N k, C) buffer, written at ``order`` and summed
over k: no scatter-add (np.add.at is slow), and the sum runs in the same order on every route.
"""
from hpcpar.backend import array_module, to_numpy
from hpcpar.precision import accumulator, gemm


def route_order(idx, n_expert, capacity=None):
    """idx (N, k) -> order (M,), offsets (E+1,) host ints, dropped (E,) assignments dropped per expert."""
    xp = array_module(idx)
    flat = idx.reshape(-1)                                  # (N k,) expert of each assignment
    order = xp.argsort(flat, kind="stable")
    counts = xp.bincount(flat, minlength=n_expert)          # (E,)
    kept = counts
    if capacity is not None:
        starts = xp.cumsum(counts) - counts
        rank = xp.arange(flat.size) - starts[flat[order]]   # position of each row within its expert
        order = order[rank < capacity]
        kept = xp.minimum(counts, capacity)
    offsets = [0] + [int(v) for v in to_numpy(xp.cumsum(kept))]
    return order, offsets, counts - kept


def dispatch_forward(x, order, k):
    """x (N, C) -> xs (M, C): each kept assignment's token row, expert by expert."""
    return x[order // k]


def dispatch_backward(dxs, order, n_token, k):
    """dxs (M, C) -> dx (N, C): each token's rows summed."""
    xp = array_module(dxs)
    buf = xp.zeros((n_token * k, dxs.shape[1]), dxs.dtype)
    buf[order] = dxs
    return buf.reshape(n_token, k, -1).sum(axis=1)


def grouped_forward(xs, w, offsets, b=None):
    """xs (M, in), w (E, in, out), b (E, out) -> ys (M, out): one GEMM per expert on its rows."""
    xp = array_module(xs)
    ys = xp.empty((xs.shape[0], w.shape[2]), xs.dtype)
    for e in range(w.shape[0]):
        lo, hi = offsets[e], offsets[e + 1]
        if hi > lo:
            gemm(xs[lo:hi], w[e], out=ys[lo:hi])
            if b is not None:
                ys[lo:hi] += b[e]
    return ys


def grouped_backward_input(dys, w, offsets):
    """dys (M, out) -> dxs (M, in)"""
    xp = array_module(dys)
    dxs = xp.empty((dys.shape[0], w.shape[1]), dys.dtype)
    for e in range(w.shape[0]):
        lo, hi = offsets[e], offsets[e + 1]
        if hi > lo:
            gemm(dys[lo:hi], w[e].T, out=dxs[lo:hi])
    return dxs


def grouped_backward_weight(dys, xs, offsets, dw, db=None):
    """Add each expert's dW_e = xs[rows of e]^T dys[rows of e] (and db_e, the rows' sum) into the
    gradients dw (E, in, out) and db (E, out); dys (M, out), xs (M, in).  Expert by expert: one
    (in, out) product at a time is added, never an (E, in, out) temporary, and no bias sum runs for
    experts without biases."""
    for e in range(dw.shape[0]):
        lo, hi = offsets[e], offsets[e + 1]
        if hi > lo:
            dw[e] += gemm(xs[lo:hi].T, dys[lo:hi])
            if db is not None:
                db[e] += dys[lo:hi].sum(axis=0, dtype=accumulator(dys.dtype))


def combine_forward(ye, w, order):
    """ye (M, C), w (N, k) -> y (N, C) = sum over a token's kept assignments of weight x expert output."""
    xp = array_module(ye)
    N, k = w.shape
    buf = xp.zeros((N * k, ye.shape[1]), ye.dtype)
    buf[order] = ye * w.reshape(-1)[order, None].astype(ye.dtype, copy=False)
    return buf.reshape(N, k, -1).sum(axis=1)


def combine_backward(dy, ye, w, order):
    """dy (N, C) -> dye (M, C), dw (N, k)"""
    xp = array_module(dy)
    N, k = w.shape
    dy_rows = dy[order // k]                                # (M, C)
    dye = dy_rows * w.reshape(-1)[order, None].astype(dy.dtype, copy=False)
    dw = xp.zeros(N * k, w.dtype)
    dw[order] = (dy_rows * ye).sum(axis=1, dtype=w.dtype)
    return dye, dw.reshape(N, k)
