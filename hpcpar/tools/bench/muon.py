"""(mu) Muon: its update against AdamW's on one rank; its three tensor-parallel modes at tp 2, 4 and 8.

One rank (``run`` without MPI peers): the bench model (bench/common.py, float32), one backward's
gradients, then AdamW's update and Muon's (Newton-Schulz, 5 steps, in float32) side by side, CPU time,
interleaved rounds; the whole step of each too; Muon's Newton-Schulz FLOPs (muon_costs) and the rate
they ran at.

tp = world size: a model of 8 heads (tp 8 divides it), one step's gradients; for each --muon-tp mode
the optimizer update's wall time (slowest rank, best round) and the bytes it handed the TP group
(against muon_costs, the planner's figure); then how far blockwise is from the exact modes - the
update of the TP-cut matrices from the same gradients (cosine, |blockwise - exact| / |exact|) and the
loss after ``STEPS`` steps of each, trained from the same start on the synthetic language.  And ZeRO-1 at
dp = world size: what each rank owns whole (data_parallel/flat.py's owners), its Newton-Schulz FLOPs and
its update's time - the owners' balance.
"""
import numpy as np
from mpi4py import MPI

from hpcpar.tools.bench.common import BENCH_MODEL, Result, best, interleave, ratio, slowest_rank

TP_MODEL = dict(model="tiny", layers=2, hidden=128, heads=8, ffn=512, seq_len=64, batch_size=8)
QUICK = dict(layers=2, hidden=64, heads=8, ffn=128, seq_len=32, batch_size=4)
STEPS = 50


def trainer(comm, **kw):
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    return Trainer(TrainConfig(progress=False, steps=10 ** 6, warmup=0, lr=2e-2, **kw), comm)


def one_rank(quick, res):
    from hpcpar.tensor_parallel.muon import muon_costs
    dims = dict(BENCH_MODEL, **(QUICK if quick else {}))
    runs = {name: trainer(MPI.COMM_SELF, optimizer=name, **dims) for name in ("adamw", "muon")}
    for t in runs.values():
        t.gradients(0)
    counter = iter(range(1, 10 ** 6))
    cases = {}
    for name, t in runs.items():
        cases[f"{name} update"] = lambda t=t: t.optimizer.step(t.dp.slices(), 1e-4)
        cases[f"{name} step"] = lambda t=t: t.step(next(counter))
    times = interleave(cases, 2 if quick else 5)
    muon = runs["muon"]
    flops = muon_costs(muon.mcfg.shape, muon.mcfg.n_layer, 1, 1, "duplicated", 5, 4)[0]
    rows = []
    for name, t in runs.items():
        update, step = best(times[f"{name} update"]), best(times[f"{name} step"])
        state = sum(a.nbytes for st in t.optimizer.state.values() for a in st.values())
        rows.append([name, f"{update * 1e3:.1f} ms", f"{step * 1e3:.1f} ms", f"{update / step:.0%}",
                     f"{state / 2**20:.2f} MiB"])
        res.figures[name] = {"update_s": update, "step_s": step, "state_bytes": state}
    ns = best(times["muon update"]) - best(times["adamw update"])
    res.figures["muon"]["ns_flops"] = flops
    res.table("Muon's update against AdamW's, one rank, the bench model (float32)",
              ["optimizer", "update", "step", "update / step", "state"], rows,
              [f"CPU time, best of the rounds.  Muon's Newton-Schulz: {flops / 1e9:.1f} GFLOP a step (5 iterations "
               f"on every block matrix: tensor_parallel/muon.muon_costs), about {flops / ns / 1e9:.1f} GFLOP/s "
               f"in the update's extra time; state: Muon's one momentum for the matrices, AdamW's two moments "
               f"for the rest."])
    res.target("Muon's state below AdamW's", "< 1x", ratio(res.figures["muon"]["state_bytes"] /
                                                           res.figures["adamw"]["state_bytes"]),
               res.figures["muon"]["state_bytes"] < res.figures["adamw"]["state_bytes"])


def cut_matrices(t):
    """{name: full array} of the TP-cut matrices' master values (assembled over TP)."""
    out = {}
    for p in t.parameters():
        if p.matrix and p.shard is not None and not p.expert:
            out[p.name] = p.shard.assemble(t.grid.tp_comm.mpi.allgather(p.master_data().copy()), p.full_shape)
    return out


def modes(world, quick, res):
    from hpcpar.tensor_parallel.muon import MODES, muon_costs
    tp = world.size
    dims = QUICK if quick else TP_MODEL
    runs = {m: trainer(world, tp=tp, optimizer="muon", muon_tp=m, **dims) for m in MODES}
    start = cut_matrices(runs["duplicated"])
    sent, after = {}, {}
    for mode, t in runs.items():
        losses = t.gradients(0)
        before = sum(c.bytes for c in t.grid.tp_comm.stats.of.values())
        t.update(0, losses)
        sent[mode] = sum(c.bytes for c in t.grid.tp_comm.stats.of.values()) - before
        after[mode] = cut_matrices(t)
        t.gradients(1)                                  # gradients to time the updates with
    cases = {m: (lambda t=t: t.optimizer.step(t.dp.slices(), 1e-6)) for m, t in runs.items()}
    times = slowest_rank(world, interleave(cases, 2 if quick else 5, MPI.Wtime, world.Barrier))

    def update(mode):
        return np.concatenate([(after[mode][n] - start[n]).ravel() for n in sorted(start)])
    exact, block = update("duplicated"), update("blockwise")
    cosine = float(exact @ block / (np.linalg.norm(exact) * np.linalg.norm(block)))
    rel = float(np.linalg.norm(block - exact) / np.linalg.norm(exact))
    steps = 10 if quick else STEPS
    final = {}
    for mode in ("duplicated", "blockwise"):
        t = trainer(world, tp=tp, optimizer="muon", muon_tp=mode, **dims)
        final[mode] = [t.step(s).loss for s in range(steps)][-1]
        t.grid.free()
    rows = []
    for mode, t in runs.items():
        blocks = sum(len(c.blocks) for c in t.chunks)
        planned = muon_costs(t.mcfg.shape, blocks, tp, 1, mode, t.cfg.ns_steps, 4)[1]
        rows.append([mode, f"{best(times[mode]) * 1e3:.1f} ms", f"{sent[mode] / 1024:.1f} KiB",
                     f"{planned / 1024:.1f} KiB"])
        res.figures[mode] = {"update_s": best(times[mode]), "bytes": sent[mode], "planned_bytes": planned}
        t.grid.free()
    res.figures["blockwise"].update(cosine=cosine, rel_diff=rel, loss=final["blockwise"],
                                    exact_loss=final["duplicated"])
    res.table(f"Muon's tensor-parallel modes at tp {tp}: the update's time and bytes, and blockwise's distance "
              f"from the exact ones", ["mode", "update", "bytes sent", "muon_costs"], rows,
              [f"A GPT of {dims['layers']} blocks, C = {dims['hidden']}, 8 heads, F = {dims['ffn']}, float32.  Wall "
               f"time of the update, slowest rank, best round; bytes one rank handed the TP group in one update.",
               f"blockwise against the exact modes, from the same gradients: update cosine {cosine:.3f}, relative "
               f"difference {rel:.3f}; loss after {steps} steps {final['blockwise']:.4f} against "
               f"{final['duplicated']:.4f}."])
    res.target(f"tp {tp}: duplicated and distributed send what muon_costs says", "equal",
               str(all(sent[m] == res.figures[m]["planned_bytes"] for m in MODES)),
               all(sent[m] == res.figures[m]["planned_bytes"] for m in MODES))


def balance(world, quick, res):
    """ZeRO-1 at dp = world size: what each rank owns (whole matrices, longest first to the least loaded,
    data_parallel/flat.py), the Newton-Schulz work it does, and its update's time."""
    dims = dict(BENCH_MODEL, **(QUICK if quick else {}))
    t = trainer(world, dp=world.size, zero=1, optimizer="muon", **dims)
    t.step(0)
    t.gradients(1)
    owned = sum(b - a for s in t.dp.slices() for _, a, b in s.segments)
    matrices = sum(b - a for s in t.dp.slices() for p, a, b in s.segments if p.matrix)
    t.optimizer.ns.flops = 0
    times = interleave({"update": lambda: t.optimizer.step(t.dp.slices(), 1e-6)}, 2 if quick else 5, MPI.Wtime)
    flops = t.optimizer.ns.flops / (len(times["update"]) + 1)          # one update's (the untimed first too)
    every = np.array(world.allgather([owned, matrices, flops, best(times["update"])]), dtype=float)
    t.grid.free()
    rows = [[r, f"{o:,.0f}", f"{m:,.0f}", f"{f / 1e9:.2f}", f"{u * 1e3:.1f} ms"] for r, (o, m, f, u) in enumerate(every)]
    spread = every[:, 1].max() / every[:, 1].mean()
    res.figures["zero_balance"] = {"owned": every[:, 0].tolist(), "matrices": every[:, 1].tolist(),
                                   "ns_flops": every[:, 2].tolist(), "update_s": every[:, 3].tolist()}
    res.table(f"Muon under ZeRO-1 at dp {world.size}: what each rank owns and orthogonalises (the bench model)",
              ["rank", "numbers owned", "of them matrices", "Newton-Schulz GFLOP", "update"], rows,
              [f"Each parameter whole on one rank, the longest first to the least loaded (LPT, data_parallel/flat.py "
               f"owners); the most matrix numbers on a rank over the mean: {spread:.2f}x (equal element ranges would "
               f"be 1.00x, and cut matrices)."])
    res.target(f"dp {world.size}: the owners' matrix numbers within 4/3 of the mean (LPT's bound)", "<= 1.33x",
               f"{spread:.2f}x", spread <= 4 / 3)


def run(quick):
    world = MPI.COMM_WORLD
    res = Result()
    if world.size == 1:
        one_rank(quick, res)
    else:
        modes(world, quick, res)
        balance(world, quick, res)
    return res if world.rank == 0 else None
