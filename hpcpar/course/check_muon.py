"""Muon's exercises: the Newton-Schulz iteration (optim/newton_schulz.py), and why tensor parallelism's
blockwise mode is another optimizer (tensor_parallel/muon.py)."""
import numpy as np

from hpcpar.course.wrong import Wrong, check_pair
from hpcpar.optim.newton_schulz import newton_schulz


def check_newton_schulz(f):
    rng = np.random.default_rng(34)
    # wide, tall, square, a single row and column; one step, three and five; float64 and float32; a
    # matrix of zeros (the norm's floor keeps it zero); the input left as it was
    cases = [((6, 10), 5, np.float64), ((10, 6), 5, np.float64), ((8, 8), 3, np.float64), ((1, 5), 1, np.float64),
             ((5, 1), 2, np.float64), ((12, 20), 5, np.float32), ((20, 12), 4, np.float32)]
    for shape, steps, dtype in cases:
        g = rng.standard_normal(shape).astype(dtype)
        keep = g.copy()
        got, want = np.asarray(f(g, steps)), newton_schulz(keep, steps)
        case = f"G of shape {shape}, {np.dtype(dtype).name}, {steps} step{'s' if steps > 1 else ''}"
        if not np.array_equal(g, keep):
            raise Wrong(f"{case}: your function changed G itself; work on a copy")
        if got.shape != want.shape:
            raise Wrong(f"{case}: the result has shape {got.shape}, expected {want.shape} (G's own)")
        if got.dtype != want.dtype:
            raise Wrong(f"{case}: the result is {got.dtype}, expected G's dtype {want.dtype}")
        if not np.all(np.isfinite(got)):
            raise Wrong(f"{case}: the result holds inf or nan - the iteration ran away (where does it need the "
                        f"singular values to start?)")
        tol = 1e-10 if dtype == np.float64 else 1e-4
        bad = ~np.isclose(got, want, rtol=tol, atol=tol)
        if bad.any():
            at = tuple(int(j) for j in np.argwhere(bad)[0])
            s = np.linalg.svd(got.astype(np.float64), compute_uv=False)
            raise Wrong(f"{case}: element [{', '.join(map(str, at))}] is {got[at]:.6g}, not what the iteration "
                        f"gives; your result's singular values run from {s.min():.3g} to {s.max():.3g}")
    zero = np.zeros((3, 4))
    got = np.asarray(f(zero.copy(), 5))
    if not (got.shape == (3, 4) and np.all(np.isfinite(got)) and not got.any()):
        raise Wrong("G of zeros: the result must be zeros too (a norm of 0 is floored at eps = 1e-7, not divided by)")


ROWS, COLS = 4, 16          # a wide update, cut by columns: every block (4, 16 / tp) is wide too


def blockwise_singular_values():
    """The singular values of [O_0 | ... | O_tp-1] at tp 2 and 4, each block orthogonalised exactly (its
    polar factor U V^T): all equal, so one number a tp."""
    g = np.random.default_rng(35).standard_normal((ROWS, COLS))
    out = []
    for tp in (2, 4):
        blocks = []
        for b in np.split(g, tp, axis=1):
            u, _, vt = np.linalg.svd(b, full_matrices=False)
            blocks.append(u @ vt)
        out.append(float(np.linalg.svd(np.concatenate(blocks, axis=1), compute_uv=False).mean()))
    return tuple(out)


def check_blockwise(answer):
    check_pair(answer, blockwise_singular_values(), ("tp 2", "tp 4"),
               "a pair of numbers (the singular value at tp 2, at tp 4)", "the singular value", "large", "small")


def ownership(buffers, n):
    """Reference: (the owner of each matrix, buffer by buffer; the numbers each rank hands MPI in one ZeRO-1
    step for these buffers) - data_parallel/flat.py's whole-tensor layout over a group of n ranks."""
    from hpcpar.data_parallel.flat import layout, owners
    load, out, handed = [0] * n, [], 0
    for sizes in buffers:
        out.append(owners(sizes, n, list(load)))
        _, size = layout(sizes, n, True, load)
        handed += size + size // n              # the reduce-scatter hands the buffer, the all-gather its range
    return out, [handed] * n


def check_ownership(f):
    # (buffers of matrix sizes, ranks): ties, a buffer of one matrix, more ranks than matrices in a buffer,
    # a group of 3; the second buffer's longest must not go to the rank that took the first's
    cases = [([[100, 10], [100, 10]], 2), ([[64, 64, 16], [48], [32, 32, 32, 8]], 3), ([[5, 7, 3, 9, 1, 2]], 2),
             ([[30], [30], [30], [30]], 4), ([[12, 12, 12], [40, 2]], 4)]
    for buffers, n in cases:
        got = f([list(b) for b in buffers], n)
        want = ownership(buffers, n)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise Wrong("return (owners, handed): owners a list per buffer, handed a number per rank")
        owners_got, handed = got
        case = f"buffers {buffers} over {n} ranks"
        for i, (g, w) in enumerate(zip(list(owners_got), want[0])):
            if list(g) != w:
                j = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
                raise Wrong(f"{case}: in buffer {i} the owner of the matrix of {buffers[i][j] if j < len(buffers[i]) else '?'} "
                            f"numbers is {list(g)[j] if j < len(g) else 'missing'}, not the rank the rule picks")
        if len(owners_got) != len(want[0]):
            raise Wrong(f"{case}: owners for {len(owners_got)} buffers, expected one list per buffer")
        if list(handed) != want[1]:
            raise Wrong(f"{case}: the numbers handed MPI are {list(handed)}, not what one ZeRO-1 step hands "
                        "(what does a rank hand the reduce-scatter, and what the all-gather - padding included?)")
