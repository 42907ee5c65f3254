"""``hpcpar plan --plot``: memory per GPU and step time of the listed layouts, side by side."""


def plot_layouts(estimates, path):
    """Two horizontal bar charts (fastest layout on top): step time split into compute, bubble and
    exposed communication, and memory per GPU split into model state and activations."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [str(e.layout) for e in estimates][::-1]
    ests = estimates[::-1]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 0.45 * len(ests) + 2.4), sharey=True)
    y = range(len(ests))
    busy = [e.pipeline.makespan * (1 - e.pipeline.bubble) for e in ests]
    idle = [e.pipeline.makespan * e.pipeline.bubble for e in ests]
    rest = [e.dp_exposed + e.optimizer for e in ests]
    ax_t.barh(y, busy, label="stage busy (compute + TP)")
    ax_t.barh(y, idle, left=busy, label="pipeline bubble")
    ax_t.barh(y, rest, left=[a + b for a, b in zip(busy, idle)], label="DP exposed + optimizer")
    ax_t.set_xlabel("predicted step time (s)")
    ax_t.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize=8)
    GiB = 2**30
    worst = [max(e.memory, key=lambda t: sum(t.values())) for e in ests]
    state = [(t["weights"] + t["gradients"] + t["optimizer state"]) / GiB for t in worst]
    acts = [(sum(t.values()) / GiB) - s for t, s in zip(worst, state)]
    ax_m.barh(y, state, label="weights, gradients, optimizer")
    ax_m.barh(y, acts, left=state, label="activations and buffers")
    ax_m.axvline(ests[0].job.hardware.usable_bytes / GiB, color="k", ls="--", lw=1, label="usable memory")
    ax_m.set_xlabel("memory per GPU, fullest stage (GiB)")
    ax_m.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize=8)
    ax_t.set_yticks(list(y))
    ax_t.set_yticklabels(names, fontsize=8)
    fig.suptitle(f"{ests[0].job.model.name} on {ests[0].job.gpus} x {ests[0].job.hardware.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
