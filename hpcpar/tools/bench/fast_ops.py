"""(fo) Each fast op against the plain one it sits beside, at the shapes of bench (s)'s 8-layer step.

Plain and fast take turns in this one process, round after round (CPU seconds); the table gives each
one's median and the median of the per-round ratios fast / plain with their range.  The two compute
the same function (tests/test_fast_ops.py checks it: in float64 to 1e-12, the AdamW step's blocks
bit for bit); only the time differs.
"""
import numpy as np

from hpcpar.tools.bench.common import Result, interleave, ms, summary, spread
from hpcpar.data_parallel.flat import FlatSlice
from hpcpar.ops.activation import gelu_backward, gelu_backward_fast, gelu_forward, gelu_forward_fast
from hpcpar.ops.attention import causal_mask
from hpcpar.ops.softmax import softmax_forward, softmax_forward_fast
from hpcpar.optim import AdamW, adamw_update
from hpcpar.training.config import TrainConfig

# bench (s)'s model: 16 x 128 tokens, ffn 2048, 8 heads; the optimizer steps a bucket at a time
SHAPES = dict(tokens=16 * 128, ffn=2048, scores=(16, 8, 128, 128), bucket=int(TrainConfig().bucket_mb * 2**20) // 4)
QUICK_SHAPES = dict(tokens=64, ffn=128, scores=(2, 2, 32, 32), bucket=1000)


def pairs(shapes):
    """name -> (plain, fast): functions of no argument, on float32 arrays of the step's shapes."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((shapes["tokens"], shapes["ffn"])).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    t, g = gelu_forward(x)[1], gelu_forward_fast(x)[1]
    s = rng.standard_normal(shapes["scores"]).astype(np.float32) + causal_mask(shapes["scores"][-1], np.float32, np)
    n = shapes["bucket"]
    p, grad = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    m, v, tmp = np.zeros(n, np.float32), np.zeros(n, np.float32), np.empty(n, np.float32)
    blocked, bucket = AdamW(1e-3), FlatSlice("w", p.copy(), grad, [])
    return {"GELU forward": (lambda: gelu_forward(x), lambda: gelu_forward_fast(x)),
            "GELU backward": (lambda: gelu_backward(dy, x, t), lambda: gelu_backward_fast(dy, g)),
            "softmax forward (attention's scores)": (lambda: softmax_forward(s), lambda: softmax_forward_fast(s)),
            "AdamW step (one bucket: whole arrays / blocks)":
                (lambda: adamw_update(p, grad, m, v, tmp, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.05),
                 lambda: blocked.step([bucket], 1e-3))}


def run(quick):
    res = Result()
    rows = []
    shapes = QUICK_SHAPES if quick else SHAPES
    for name, (plain, fast) in pairs(shapes).items():
        times = interleave({"fast": fast, "plain": plain}, 3 if quick else 9)
        fig = summary(times, "fast", "plain")
        res.figures[name] = fig
        rows.append([name, ms(fig["theirs_median_s"]), ms(fig["ours_median_s"]), spread(fig)])
    res.table("Fast ops against their plain versions (CPU seconds, float32, the 8-layer step's shapes)",
              ["op", "plain (median)", "fast (median)", "fast / plain: median of the rounds (range)"], rows,
              ["GELU on 16 x 128 tokens x ffn 2048; softmax on 16 x 8 heads x 128 x 128 masked scores; "
               f"AdamW on one gradient bucket ({shapes['bucket']} numbers)."])
    return res
