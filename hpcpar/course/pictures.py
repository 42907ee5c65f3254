"""The lessons' pictures, drawn from the package's own functions: ``python -m hpcpar.course.pictures
[FOLDER]`` (``make docs``) writes them into docs/course/img/.

Each picture shows what a lesson explains, not what its exercise asks: the blocks of causal attention
(query_blocks), a ring all-reduce's state step by step (the course's simulated ring), the column and
row cuts of a tensor-parallel pair (Shard), GPipe's timeline (the simulator), a ZeRO-1 bucket's slices
(FlatBuffer: parameters and padding), the rank grid over two nodes (GridLayout), the causal balance of context parallelism
(balanced_positions), ZB-H1's postponed weight gradients, and the rows of an expert all-to-all.
"""
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "course" / "img"


def _figure(width, height):
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), dpi=100)


def causal_blocks(path):
    from hpcpar.ops.attention import query_blocks
    T, block = 16, 4
    grid = np.full((T, T), np.nan)
    for b, (a, z) in enumerate(query_blocks(T, block)):
        grid[a:z, :z] = b                                   # the block's S, P: keys [0, z)
        grid[a:z, :z][np.arange(z)[None, :] > np.arange(a, z)[:, None]] = 7      # masked in its square (grey)
    fig = _figure(4.2, 4)
    ax = fig.subplots()
    ax.imshow(np.ma.masked_invalid(grid), cmap="tab10", vmin=-0.5, vmax=9.5)
    ax.set(title=f"T = {T} in blocks of {block} query rows:\ncomputed (colour), masked (grey), skipped (white)",
           xlabel="key", ylabel="query")
    fig.savefig(path, bbox_inches="tight")


def ring_allreduce(path):
    from hpcpar.course.collectives import ring_allreduce as ring
    p = 4
    # chunk c of rank r holds (2^r, c): a partial sum's first number names the ranks in it (bit r), its
    # second is c times their count
    xs = [np.array([[2.0 ** r, c] for c in range(p)]).ravel() for r in range(p)]
    states, step = [[[1 << r] * p for r in range(p)]], []

    def send(src, dst, data):
        step.append((dst, int(data[0]), int(round(data[1] / bin(int(data[0])).count("1")))))
        if len(step) == p:                                  # a whole step of the ring: apply it
            state = [row[:] for row in states[-1]]
            for d, bits, c in step:
                state[d][c] = bits | state[d][c] if len(states) < p else bits
            states.append(state)
            step.clear()
    ring(xs, send)
    fig = _figure(2.2 * len(states), 2.8)
    for i, (ax, state) in enumerate(zip(fig.subplots(1, len(states)), states)):
        ax.imshow([[bin(v).count("1") for v in row] for row in state], cmap="Blues", vmin=0, vmax=p)
        ax.set(title="start" if i == 0 else f"{'reduce-scatter' if i < p else 'all-gather'} {i if i < p else i - p + 1}",
               xticks=range(p), yticks=range(p), xlabel="chunk", ylabel="rank" if i == 0 else "")
    fig.suptitle("a ring all-reduce on 4 ranks: how many ranks' numbers each copy of a chunk sums")
    fig.savefig(path, bbox_inches="tight")


def tp_pair(path):
    from hpcpar.nn.parameter import Shard
    tp, C, H = 2, 4, 8
    fig = _figure(7, 3)
    for ax, (name, shape, dim) in zip(fig.subplots(1, 2), (("W1 (C, H): columns", (C, H), 1),
                                                            ("W2 (H, C): rows", (H, C), 0))):
        owner = np.zeros(shape)
        index = np.arange(np.prod(shape)).reshape(shape)
        for r in range(tp):
            owner.flat[Shard(dim, tp, r).take(index).ravel()] = r
        ax.imshow(owner, cmap="coolwarm")
        ax.set(title=f"{name} cut over tp {tp}", xticks=[], yticks=[])
    fig.suptitle("column-parallel then row-parallel: rank 0 blue, rank 1 red; the product needs one sum")
    fig.savefig(path, bbox_inches="tight")


def timeline(name, path, stages=4, microbatches=8):
    from hpcpar.pipeline.plot import plot_timeline
    from hpcpar.pipeline.schedules import build
    from hpcpar.pipeline.simulate import Costs, simulate
    result = simulate(build(name, stages, microbatches), Costs(F=1, B=1, W=1))
    plot_timeline(result.rows(), path, title=f"{name}: p={stages}, m={microbatches}, F = B = W = 1")


def zero1_bucket(path):
    from hpcpar.data_parallel.flat import FlatBuffer
    dp, sizes = 4, (5, 3, 6)
    params = [SimpleNamespace(data=np.zeros(n), grad=np.zeros(n)) for n in sizes]
    bucket = FlatBuffer(params, SimpleNamespace(size=dp, rank=0))
    fig = _figure(7, 1.2)
    ax = fig.subplots()
    for i, (_, a, b) in enumerate(bucket.segments):
        ax.barh(1, b - a, left=a, color=f"C{i}", edgecolor="k")
    ax.barh(1, bucket.size - bucket.segments[-1][2], left=bucket.segments[-1][2], color="w", edgecolor="k",
            hatch="//")
    ax.set(yticks=[], xlabel="position in the flat bucket",
           title=f"a bucket of {sum(sizes)} numbers, padded (hatched) for dp {dp}: where are the ranks' slices?")
    fig.savefig(path, bbox_inches="tight")


def grid(path):
    from matplotlib.patches import Rectangle

    from hpcpar.comm.grid import GridLayout
    tp, pp, dp, per_node = 2, 4, 2, 8
    layout = GridLayout(tp * pp * dp, tp=tp, pp=pp, dp=dp)
    fig = _figure(6, 3.2)
    ax = fig.subplots()
    for rank in range(tp * pp * dp):
        c = layout.coord(rank)
        x, y = c.pp * (tp + 1) + c.tp, c.dp
        ax.add_patch(Rectangle((x, y), 0.9, 0.9, color=f"C{rank // per_node}", alpha=0.5))
        ax.text(x + 0.45, y + 0.45, str(rank), ha="center", va="center")
    ax.set(xlim=(0, pp * (tp + 1)), ylim=(0, dp), xticks=[s * (tp + 1) + tp / 2 for s in range(pp)],
           xticklabels=[f"stage {s}" for s in range(pp)], yticks=[d + 0.45 for d in range(dp)],
           yticklabels=[f"replica {d}" for d in range(dp)],
           title=f"tp {tp} x pp {pp} x dp {dp}, order tp-dp-pp: rank numbers; colour: node of {per_node}")
    fig.savefig(path, bbox_inches="tight")


def causal_balance(path):
    from hpcpar.ops.ring_attention import balanced_positions
    T, cp = 16, 4
    owner = np.full((T, T), np.nan)
    for r in range(cp):
        for q in balanced_positions(T, cp, r):
            owner[q, :q + 1] = r                            # the causal scores of rank r's queries
    fig = _figure(4.2, 4)
    ax = fig.subplots()
    ax.imshow(np.ma.masked_invalid(owner), cmap="tab10", vmin=-0.5, vmax=9.5)
    ax.set(title=f"causal scores of T = {T} over cp {cp}: colour = the rank\nwhose queries they are "
                 "(one early, one late chunk each)", xlabel="key", ylabel="query")
    fig.savefig(path, bbox_inches="tight")


def all_to_all(path):
    from hpcpar.ops.moe import route_order
    ep, E, N, k = 4, 8, 64, 2
    counts = np.zeros((ep, ep), dtype=int)
    for r in range(ep):
        rng = np.random.default_rng(r)
        idx = np.stack([rng.choice(E, k, replace=False, p=np.arange(1, E + 1) / (E * (E + 1) / 2)) for _ in range(N)])
        order = route_order(idx, E)[0]
        counts[r] = np.bincount(idx.reshape(-1)[order] // (E // ep), minlength=ep)
    fig = _figure(4.4, 3.8)
    ax = fig.subplots()
    ax.imshow(counts, cmap="Oranges")
    for (i, j), n in np.ndenumerate(counts):
        ax.text(j, i, str(n), ha="center", va="center")
    ax.set(title=f"rows each rank sends each rank (ep {ep}, {E} experts,\n{N} tokens a rank, top-{k}, a skewed router)",
           xlabel="to rank (its experts)", ylabel="from rank", xticks=range(ep), yticks=range(ep))
    fig.savefig(path, bbox_inches="tight")


PICTURES = {"01-causal-blocks.png": causal_blocks, "02-ring-allreduce.png": ring_allreduce,
            "03-tp-pair.png": tp_pair, "04-gpipe.png": lambda p: timeline("gpipe", p),
            "05-zero1-bucket.png": zero1_bucket, "06-grid.png": grid, "09-causal-balance.png": causal_balance,
            "15-zb-h1.png": lambda p: timeline("zb-h1", p), "16-all-to-all.png": all_to_all}


def main(argv):
    folder = Path(argv[0]) if argv else FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for name, draw in PICTURES.items():
        draw(folder / name)
        print(f"wrote {folder / name}")


if __name__ == "__main__":
    main(sys.argv[1:])
