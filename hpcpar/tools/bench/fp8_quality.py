"""The quality study of docs/precision.md, section 6: each recipe's validation loss against bf16's.

    python -m hpcpar.tools.bench.fp8_quality RUNS_DIR FIGURE.png

reads RUNS_DIR/<precision>.jsonl (``hpcpar train --metrics`` with --eval-every) for bf16, fp32 and
the FP8/FP4 recipes, prints the Markdown table of the final validation loss and its gap to bf16
(absolute and relative), and draws the validation curves beside bf16's into FIGURE.png.  A figure
of one run each, not a test: the gaps are single runs on 24 KB of text.
"""
import json
import sys
from pathlib import Path

from hpcpar.precision import FP8

ORDER = ("bf16", "fp32") + FP8


def curves(directory):
    """{precision: [(step, val_loss)]} of the runs found in ``directory``."""
    out = {}
    for name in ORDER:
        path = Path(directory, f"{name}.jsonl")
        if path.exists():
            records = [json.loads(line) for line in path.read_text().splitlines()]
            out[name] = [(r["step"] + 1, r["val_loss"]) for r in records if "val_loss" in r]
    return out


def table(found):
    base = found["bf16"][-1][1]
    lines = ["| precision | validation loss | gap to bf16 | relative |", "|---|---|---|---|"]
    for name, points in found.items():
        loss = points[-1][1]
        lines.append(f"| {name} | {loss:.4f} | {loss - base:+.4f} | {100 * (loss - base) / base:+.2f}% |")
    return "\n".join(lines)


def plot(found, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in found.items():
        steps, losses = zip(*points)
        ax.plot(steps, losses, marker="o", markersize=3, label=name, linewidth=2 if name == "bf16" else 1,
                color="black" if name == "bf16" else None)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    ax.set_title("tiny GPT on data/sample.txt: each recipe (bf16 elsewhere) against bf16")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    directory, figure = (argv or sys.argv[1:])[:2]
    found = curves(directory)
    print(table(found))
    plot(found, figure)


if __name__ == "__main__":
    main()
