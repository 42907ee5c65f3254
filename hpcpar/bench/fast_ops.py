"""(fo) Each fast op against the plain one it sits beside, at the shapes of bench (s)'s 8-layer step.

Plain and fast take turns in this one process, round after round (CPU seconds); the table gives each
one's median and the median of the per-round ratios fast / plain with their range.  The two compute
the same function (tests/test_fast_ops.py checks it in float64 to 1e-12); only the time differs.
"""
import numpy as np

from hpcpar.bench.common import Result, interleave, ms, summary, spread
from hpcpar.ops.activation import gelu_backward, gelu_backward_fast, gelu_forward, gelu_forward_fast
from hpcpar.ops.attention import causal_mask
from hpcpar.ops.softmax import softmax_forward, softmax_forward_fast

# bench (s)'s model: 16 x 128 tokens, ffn 2048, 8 heads
SHAPES = dict(tokens=16 * 128, ffn=2048, scores=(16, 8, 128, 128))
QUICK_SHAPES = dict(tokens=64, ffn=128, scores=(2, 2, 32, 32))


def pairs(shapes):
    """name -> (plain, fast): functions of no argument, on float32 arrays of the step's shapes."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((shapes["tokens"], shapes["ffn"])).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    t, g = gelu_forward(x)[1], gelu_forward_fast(x)[1]
    s = rng.standard_normal(shapes["scores"]).astype(np.float32) + causal_mask(shapes["scores"][-1], np.float32, np)
    return {"GELU forward": (lambda: gelu_forward(x), lambda: gelu_forward_fast(x)),
            "GELU backward": (lambda: gelu_backward(dy, x, t), lambda: gelu_backward_fast(dy, g)),
            "softmax forward (attention's scores)": (lambda: softmax_forward(s), lambda: softmax_forward_fast(s))}


def run(quick):
    res = Result()
    rows = []
    for name, (plain, fast) in pairs(QUICK_SHAPES if quick else SHAPES).items():
        times = interleave({"fast": fast, "plain": plain}, 3 if quick else 9)
        fig = summary(times, "fast", "plain")
        res.figures[name] = fig
        rows.append([name, ms(fig["theirs_median_s"]), ms(fig["ours_median_s"]), spread(fig)])
    res.table("Fast ops against their plain versions (CPU seconds, float32, the 8-layer step's shapes)",
              ["op", "plain (median)", "fast (median)", "fast / plain: median of the rounds (range)"], rows,
              ["GELU on 16 x 128 tokens x ffn 2048; softmax on 16 x 8 heads x 128 x 128 masked scores."])
    return res
