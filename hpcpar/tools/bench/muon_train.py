"""(mtr) Does Muon train better?  AdamW against Muon at their best learning rates: steps to a fixed loss.

Two tasks, the tiny GPT (2 blocks, C = 64, 4 heads, T = 64, 32 sequences a step, float32, cosine
schedule with 10 warm-up steps), each optimizer at five learning rates (Muon's moonlight scale gives
its matrices AdamW's update RMS, so the same range serves both):

    synthetic   the Markov language (hpcpar/data.py, entropy floor 0.91): every batch is fresh, so the
                training loss is a validation loss; the target is 1.5x the floor
    sample.txt  data/sample.txt prepared by `hpcpar data prepare` (byte-level BPE, vocabulary 512; 10 %
                held out): the validation loss every 20 steps, on 4 batches of the held-out tokens

For each, the table gives the best learning rate of each optimizer (the lowest loss it reached), the
step at which it first reached the target, and that lowest loss; the figure (docs/img/muon_vs_adamw.png) the
curves at those rates.  A measurement of two tiny models on a few hundred steps, not a claim about
large ones: the literature's (Moonlight: about 2x fewer FLOPs to the same loss at scale) is quoted in
docs/optimizers.md beside it.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from hpcpar.tools.bench.common import Result

STEPS, QUICK_STEPS = 300, 20
RATES = {"adamw": (1e-3, 3e-3, 1e-2, 3e-2, 1e-1), "muon": (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)}
SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample.txt"
FIGURE = Path(__file__).resolve().parents[2] / "docs" / "img" / "muon_vs_adamw.png"


def losses(optimizer, lr, steps, data=None):
    """[(step, loss)] of one run: the training loss (synthetic) or the validation loss (a prepared text)."""
    from mpi4py import MPI
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    extra = dict(data=data, eval_every=20, eval_batches=4) if data else {}
    t = Trainer(TrainConfig(model="tiny", optimizer=optimizer, lr=lr, steps=steps, warmup=10, progress=False,
                            **extra), MPI.COMM_SELF)
    out = []
    for s in range(steps):
        loss = t.step(s).loss
        if not data:
            out.append((s + 1, loss))
        elif (s + 1) % 20 == 0 or s + 1 == steps:
            out.append((s + 1, t.evaluate(4)))
    t.grid.free()
    return out


def prepare(workdir):
    """data/sample.txt as train.bin / val.bin with a vocabulary of 512 (hpcpar data prepare)."""
    out = Path(workdir) / "sample"
    subprocess.run([sys.executable, "-m", "hpcpar", "data", "prepare", str(SAMPLE), "-o", str(out), "--vocab", "512"],
                   check=True, capture_output=True)
    return str(out)


def smoothed(curve):
    """(steps, losses) of a curve; the training loss of single batches (a point a step) as the mean of the
    10 steps up to each."""
    steps, values = np.array([s for s, _ in curve]), np.array([v for _, v in curve])
    if len(values) > 50:
        total = np.cumsum(values)
        values = (total - np.concatenate([np.zeros(10), total[:-10]])) / np.minimum(np.arange(1, len(values) + 1), 10)
    return steps, values


def first_below(curve, target):
    """The first step whose (smoothed) loss is at or below ``target``, or None."""
    steps, values = smoothed(curve)
    hit = np.flatnonzero(values <= target)
    return int(steps[hit[0]]) if hit.size else None


def lowest(curve):
    """(the lowest (smoothed) loss of a curve, its step): a small text overfits, so the last is not the best."""
    steps, values = smoothed(curve)
    return float(values.min()), int(steps[values.argmin()])


def run(quick):
    from hpcpar.data import MarkovLanguage
    steps = QUICK_STEPS if quick else STEPS
    res, rows, best = Result(), [], {}
    floor = MarkovLanguage(32, 2, 4, seq_len=64, seed=0).entropy_floor
    with tempfile.TemporaryDirectory() as tmp:
        tasks = {"synthetic": (None, 1.5 * floor), "sample.txt": (prepare(tmp), None)}
        for task, (data, target) in tasks.items():
            curves = {(o, lr): losses(o, lr, steps, data) for o, rates in RATES.items() for lr in rates}
            if target is None:                  # the text: 1.02x the better optimizer's best validation loss
                target = 1.02 * min(lowest(c)[0] for c in curves.values())
            for o in RATES:
                lr = min(RATES[o], key=lambda r: lowest(curves[o, r])[0])
                curve = curves[o, lr]
                reached, (low, at) = first_below(curve, target), lowest(curve)
                best[task, o] = (lr, curve)
                rows.append([task, o, f"{lr:g}", f"{target:.3f}", reached or f"> {steps}", f"{low:.4f} (step {at})",
                             " ".join(f"{lowest(curves[o, r])[0]:.3f}" for r in RATES[o])])
                res.figures[f"{task}_{o}"] = {"lr": lr, "target": target, "steps_to_target": reached,
                                              "lowest": low, "lowest_step": at, "curve": curve}
    res.table(f"AdamW against Muon, the tiny GPT, {steps} steps, each at its best of five learning rates",
              ["task", "optimizer", "best lr", "target loss", "steps to target", "lowest loss",
               "lowest loss at lr " + ", ".join(f"{r:g}" for r in RATES["adamw"])], rows,
              [f"synthetic: training loss of fresh batches (a validation loss), mean of the 10 steps up to each, "
               f"target 1.5x the entropy floor {floor:.3f}; sample.txt: validation loss every 20 steps (the text is "
               f"small: both overfit after their lowest), target 1.02x the lowest either reached.  The best lr: the "
               f"lowest loss.  Figure: docs/img/muon_vs_adamw.png."])
    if not quick:
        draw(best, steps)
    return res


def draw(best, steps):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, task in zip(axes, ("synthetic", "sample.txt")):
        for o, style in (("adamw", "-"), ("muon", "--")):
            lr, curve = best[task, o]
            ax.plot([s for s, _ in curve], [v for _, v in curve], style, label=f"{o}, lr {lr:g}")
        ax.set_title(f"{task}: {'training loss (fresh batches)' if task == 'synthetic' else 'validation loss'}")
        ax.set_xlabel("step")
        ax.set_xlim(0, steps)
        ax.legend()
    axes[0].set_ylabel("loss")
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=100)
