"""Central finite differences: the independent check of every hand-written backward."""
import numpy as np


def numeric_grad(loss_fn, x, n=24, eps=1e-4, seed=0):
    """d loss / d x at ``n`` random elements of x (float64), by the fourth-order central difference
        f'(x) ~ (-f(x+2e) + 8 f(x+e) - 8 f(x-e) + f(x-2e)) / 12e      (error O(e^4))
    whose small truncation error allows a step large enough to keep round-off out of the way.
    Returns (flat indices, gradient values)."""
    rng = np.random.default_rng(seed)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, size=min(n, flat.size), replace=False)
    out = []
    for i in idx:
        old = flat[i]
        f = {}
        for k in (-2, -1, 1, 2):
            flat[i] = old + k * eps
            f[k] = loss_fn()
        flat[i] = old
        out.append((-f[2] + 8 * f[1] - 8 * f[-1] + f[-2]) / (12 * eps))
    return idx, np.array(out)


def assert_grad(loss_fn, x, analytic, what, rtol=1e-6, n=24):
    """The analytic gradient of ``x`` agrees with finite differences (relative error of the vector)."""
    idx, num = numeric_grad(loss_fn, x, n)
    ana = np.asarray(analytic).reshape(-1)[idx]
    err = np.linalg.norm(num - ana) / max(np.linalg.norm(num), 1e-30)
    assert err <= rtol, f"{what}: finite-difference relative error {err:.2e} > {rtol:.0e}"
