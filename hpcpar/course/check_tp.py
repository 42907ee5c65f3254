"""Tensor-parallel exercises: the column split's backward, the row split's forward, the bytes of the
all-reduces (ranks simulated: a list holds one array per rank), and an MLP on MPI ranks whose
all-reduces the student places."""
import numpy as np

from hpcpar.course.on_ranks import groups, stage
from hpcpar.course.wrong import Wrong
from hpcpar.nn.gpt import preset
from hpcpar.ops.linear import linear_backward_input, linear_backward_weight, linear_forward


def column_parallel_backward(x, w_part, dy_part):
    """Reference: rank i holds W[:, cols_i]; y_i = x W_i.  Its share of dL/dx is dy_i W_i^T (a partial
    sum: the f operator all-reduces it), dW_i = x^T dy_i and db_i = sum of dy_i are its own."""
    return (linear_backward_input(dy_part, w_part), *linear_backward_weight(dy_part, x))


def row_parallel_forward(x_parts, w_parts, b):
    """Reference: rank i holds W[rows_i, :] and x[..., rows_i]; y = sum_i x_i W_i (the all-reduce), then b once."""
    partial = [linear_forward(x, w) for x, w in zip(x_parts, w_parts)]      # (..., out) each, not yet y
    total = sum(partial)                                                    # the all-reduce
    return [total + b for _ in partial]


def _close(got, want, what):
    got = np.asarray(got)
    if got.shape != want.shape:
        raise Wrong(f"{what} has shape {got.shape}, expected {want.shape}")
    bad = ~np.isclose(got, want, rtol=1e-10, atol=1e-12)     # float64 of the same sums in another order
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise Wrong(f"{what} differs first at {list(i)}: {got[i]:.6g}, expected {want[i]:.6g}")


def check_column_backward(f):
    rng = np.random.default_rng(0)
    x, w, dy = rng.standard_normal((2, 3, 8)), rng.standard_normal((8, 6)), rng.standard_normal((2, 3, 6))
    dx_full = linear_backward_input(dy, w)
    dw_full, db_full = linear_backward_weight(dy, x)
    for tp in (2, 3):
        cols = np.split(np.arange(6), tp)
        parts = [f(x, w[:, c], dy[..., c]) for c in cols]
        for i, (c, part) in enumerate(zip(cols, parts)):
            if not isinstance(part, tuple) or len(part) != 3:
                raise Wrong("return a tuple (dx_part, dw_part, db_part)")
            _close(part[1], dw_full[:, c], f"tp {tp}, rank {i}: dw_part (its columns of x^T dy)")
            _close(part[2], db_full[c], f"tp {tp}, rank {i}: db_part (its columns of dy, summed over rows)")
        total = sum(np.asarray(p[0]) for p in parts)
        if np.allclose(parts[0][0], dx_full):
            raise Wrong("rank 0's dx_part is already the whole dL/dx: each rank only has dy for its own "
                        "columns, so it can compute only dy_i W_i^T; the all-reduce adds the parts")
        _close(total, dx_full, f"tp {tp}: the sum of the dx parts (what the all-reduce makes)")


def check_row_forward(f):
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((2, 3, 8)), rng.standard_normal((8, 5)), rng.standard_normal(5)
    want = linear_forward(x, w, b)
    for tp in (2, 4):
        rows = np.split(np.arange(8), tp)
        out = f([x[..., r] for r in rows], [w[r] for r in rows], b)
        if len(out) != tp:
            raise Wrong(f"return one output per rank: {tp} ranks, got {len(out)}")
        for i, y in enumerate(out):
            y = np.asarray(y)
            if y.shape == want.shape and np.allclose(y, want + (tp - 1) * b):
                raise Wrong(f"tp {tp}: the bias is added {tp} times - every rank added it before the "
                            "all-reduce; add it once, after the sum")
            _close(y, want, f"tp {tp}, rank {i}: y")


def activation_allreduce_mib():
    """Reference: `hpcpar train --tp 2 --dtype float64` (tiny, 32 x 64 tokens) per rank and step: in each
    block 2 all-reduces forward (attention and MLP outputs, g) and 2 backward (their inputs, f), plus
    the embedding's g and the head's f: (4 L + 2) activations of b s h float64 numbers."""
    cfg = preset("tiny")
    activation = 32 * cfg.seq_len * cfg.d_model * 8
    return (4 * cfg.n_layer + 2) * activation / 2 ** 20


def check_allreduce_mib(answer):
    want = activation_allreduce_mib()
    if not isinstance(answer, (int, float)):
        raise Wrong(f"ANSWER is a number of MiB, got {answer!r}")
    if abs(answer - want) > 0.05 * want:
        raise Wrong(f"{answer} MiB is too {'high' if answer > want else 'low'} (within 5 % passes)")


# --- exercise 15: a tensor-parallel MLP on MPI ranks ---------------------------------------------------


def tp_mlp(comm, x, w1, b1, w2, b2, dy):
    """Reference: h = tanh(x W1 + b1) with W1 cut by columns, y = h W2 + b2 with W2 cut by rows; the
    forward's all-reduce (g) sums the rows' partial products before the bias, the backward's (f) sums
    the column parts of dL/dx.  -> (y, dx), whole on every rank."""
    h = np.tanh(linear_forward(x, w1, b1))                        # (B, T, H/tp): this rank's columns
    y = comm.all_reduce(linear_forward(h, w2)) + b2               # g: partial sums -> y, then b2 once
    dh = linear_backward_input(dy, w2)                            # (B, T, H/tp): its columns of dL/dh
    dx = comm.all_reduce(linear_backward_input(dh * (1 - h * h), w1))    # f: the parts of dL/dx summed
    return y, dx


def _tp_mlp_case(f, comm):
    tp = comm.size
    rng = np.random.default_rng(7)                                # the same full tensors on every rank
    x, dy = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 8))
    w1, b1 = rng.standard_normal((8, 4 * tp)), rng.standard_normal(4 * tp)
    w2, b2 = rng.standard_normal((4 * tp, 8)), rng.standard_normal(8)
    cols = np.split(np.arange(4 * tp), tp)[comm.rank]
    calls, nbytes = dict(comm.stats.calls), dict(comm.stats.bytes)
    y, dx = f(comm, x.copy(), w1[:, cols].copy(), b1[cols].copy(), w2[cols].copy(), b2.copy(), dy.copy())
    reduces = comm.stats.calls["all_reduce"] - calls.get("all_reduce", 0)
    reduced = comm.stats.bytes["all_reduce"] - nbytes.get("all_reduce", 0)
    h = np.tanh(linear_forward(x, w1, b1))                        # the layer on one rank: what TP must give
    want_y = linear_forward(h, w2, b2)
    want_dx = linear_backward_input(linear_backward_input(dy, w2) * (1 - h * h), w1)
    for what, got, want in (("y", y, want_y), ("dx", dx, want_dx)):
        got = np.asarray(got)
        if got.shape != want.shape:
            raise Wrong(f"tp {tp}: {what} has shape {got.shape}, expected the whole {want.shape}")
        if not np.allclose(got, want, rtol=1e-10, atol=1e-12):
            extra = [k for k in range(-tp, tp + 1) if k and np.allclose(got, want + k * b2, rtol=1e-10, atol=1e-12)]
            raise Wrong(f"tp {tp}: {what} differs from the one-rank layer" +
                        (f": b2 is counted {1 + extra[0]} times" if what == "y" and extra else
                         f" by up to {np.abs(got - want).max():.3g}"))
    if reduces != 2 or reduced != x.nbytes + dy.nbytes:
        raise Wrong(f"tp {tp}: {reduces} all-reduces of {reduced} bytes in all; the layer needs one of y "
                    f"({x.nbytes} bytes) in forward and one of dx in backward")


def check_tp_mlp(f, world):
    """The MLP at tp 2, 3 and 4 (groups of the job's 4 ranks)."""
    for _, comm in groups(world, (2, 3, world.size)):
        stage(world, lambda: comm and _tp_mlp_case(f, comm))


# --- exercise 30: your column/row pair, in the trainer -------------------------------------------------

PAIR = ("column_forward", "column_backward", "row_forward", "row_backward")


def _calls(comm, since):
    return {op: n - since.get(op, 0) for op, n in comm.stats.calls.items() if n - since.get(op, 0)}


def _tp_pair_case(m, comm):
    """The four functions on one MLP cut over ``comm``: each output against the one-rank layer's, and
    the all-reduces each makes (f: none forward, one backward; g: one forward, none backward)."""
    tp, r = comm.size, comm.rank
    rng = np.random.default_rng(30)
    x, dy = rng.standard_normal((2, 3, 6)), rng.standard_normal((2, 3, 6))
    w1, b1, w2, b2 = (rng.standard_normal(s) for s in ((6, 4 * tp), (4 * tp,), (4 * tp, 6), (6,)))
    cols = np.split(np.arange(4 * tp), tp)[r]
    h = linear_forward(x, w1, b1)                                     # (no activation: the pair alone)
    dh = linear_backward_input(dy, w2)
    want = {"column_forward": (h[..., cols],),
            "row_forward": (linear_forward(h, w2, b2),),
            "row_backward": (dh[..., cols], *linear_backward_weight(dy, h[..., cols])),
            "column_backward": (linear_backward_input(dh, w1), *linear_backward_weight(dh[..., cols], x))}
    calls = {"column_forward": {}, "row_forward": {"all_reduce": 1}, "row_backward": {},
             "column_backward": {"all_reduce": 1}}
    args = {"column_forward": (x.copy(), w1[:, cols].copy(), b1[cols].copy()),
            "row_forward": (h[..., cols].copy(), w2[cols].copy(), b2.copy()),
            "row_backward": (dy.copy(), h[..., cols].copy(), w2[cols].copy()),
            "column_backward": (dh[..., cols].copy(), x.copy(), w1[:, cols].copy())}
    for name in ("column_forward", "row_forward", "row_backward", "column_backward"):
        since = dict(comm.stats.calls)
        got = getattr(m, name)(*args[name], comm)
        made = _calls(comm, since)
        got = (got,) if name.endswith("forward") else tuple(got)
        for what, g, w in zip(("y",) if name.endswith("forward") else ("dx", "dw", "db"), got, want[name]):
            _close(g, w, f"tp {tp}, rank {r}: {name}'s {what}")
        if made != calls[name]:
            said = ", ".join(f"{n} {op}" for op, n in made.items()) or "no communication"
            raise Wrong(f"tp {tp}: {name} made {said}; "
                        + ("it needs one all-reduce" if calls[name] else "it needs none"))


def check_tp_pair(m, world):
    """The pair on 2, 3 and 4 ranks, then in the trainer at tp 2 and tp 4."""
    from hpcpar.course.plugged import GPT, check_in_trainer
    for _, comm in groups(world, (2, 3, world.size)):
        stage(world, lambda: comm and _tp_pair_case(m, comm))
    check_in_trainer(m, world, GPT, [dict(tp=2), dict(tp=world.size)])
