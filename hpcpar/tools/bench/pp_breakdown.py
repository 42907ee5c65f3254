"""(ppb) Where a pp 2, 1F1B step's time goes, stage by stage: ours against torch.distributed.pipelining.

Bench (e) gives one ratio per layout; this section says where the two pipelines differ.  Both run the
benchmark GPT (common.py) as two stages, ``Schedule1F1B`` against our 1F1B with the same 8
micro-batches, in the same two processes, taking turns step by step after a barrier, and each rank
splits its own step (wall seconds, mean over the rounds) into:

    compute     forward, backward and the loss of every micro-batch
                ours: hpcpar/training/profiler.py's GEMM + attention + element-wise + embedding/loss + other
                PyTorch: PipelineStage.forward_one_chunk / backward_one_chunk and the schedule's loss
    optimizer   the AdamW update (ours: also the gradient norm and zeroing)
    messages    posting the activation/gradient sends and receives, and waiting for them - a stage
                idle because its neighbour has not sent yet waits here, so the bubble is in this row
                ours: time inside the pp communicator (hpcpar.comm: isend, irecv_, waits)
                PyTorch: the schedule's _batch_p2p (posting, gloo) and _wait_batch_p2p (waiting)
    tied sum    the all-reduce of the tied token embedding's two copies (first and last stage);
                only in our tied run: PyTorch's stages cannot share a weight, so (e) runs untied
    other       the rest of the step: the engine's or the schedule's own Python, the data

Under each stage: the schedule's own bubble, (p - 1) / m of the slowest stage's compute (1F1B with p = 2
stages, m = 8 micro-batches: about one micro-batch's forward and backward), and the imbalance - how much
less this stage computes than the slowest, which it spends waiting for it.  What a stage waits beyond
those two is lost to the messages themselves (or, on a shared machine, to waiting for a core).  The
first stage waits for the last backward at the end; the last stage only for the first forward at the
start, so its own bubble is smaller than (p - 1) / m and its "beyond" row can be negative.

PyTorch's side is timed by wrapping the schedule's functions, the regions torch.profiler shows as
"Forward i" / "Backward i" and gloo's send/recv; ours by hpcpar's own profiler (``--profile``).
docs/performance.md explains how to read the table.
"""
import statistics
import time

from mpi4py import MPI

from hpcpar.tools.bench.common import BENCH_MODEL, Result, import_torch, ms, pct
from hpcpar.tools.bench.torch_parallel import init_gloo, torch_pipeline_step

LAYOUT = dict(pp=2, schedule="1f1b", microbatches=8)
QUICK_MODEL = dict(hidden=32, layers=4, heads=2, seq_len=16, vocab=64, batch_size=8)
ROWS = ("compute", "optimizer", "messages", "tied sum", "other")
OURS_COMPUTE = ("GEMM", "attention", "elementwise", "embedding/loss", "other")


def our_case(dims, world, tied):
    """(step function, Profiler to install around it, trainer) for our pp 2 1F1B run."""
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.profiler import Profiler
    from hpcpar.training.step import Trainer
    cfg = TrainConfig(model="small", untied=not tied, steps=10 ** 6, progress=False, grad_clip=0.0, **dims, **LAYOUT)
    trainer = Trainer(cfg, world)
    counter = iter(range(10 ** 6))
    return (lambda: trainer.step(next(counter))), Profiler(time.perf_counter), trainer


def our_rows(per_step):
    """hpcpar.training.profiler's per_step() -> {row: seconds}."""
    rows = dict.fromkeys(ROWS, 0.0)
    for category, seconds in per_step.items():
        if category in OURS_COMPUTE:
            rows["compute"] += seconds
        elif category == "optimizer":
            rows["optimizer"] += seconds
        elif category == "comm pp":
            rows["messages"] += seconds
        elif category == "comm embed":
            rows["tied sum"] += seconds
        elif category != "step":
            rows["other"] += seconds              # data, comm world/dp
    rows["step"] = per_step["step"]
    return rows


class TorchSplit:
    """Wall seconds of PyTorch's pipeline step by row, from wrappers around the schedule's own functions."""

    def __init__(self, torch, schedule_step):
        from torch.distributed.pipelining import schedules
        self.seconds, self.steps, self.step_seconds = dict.fromkeys(ROWS, 0.0), 0, 0.0
        self.schedules, self.undo = schedules, []
        self.step = schedule_step

    def _wrap(self, owner, name, row):
        fn, own = getattr(owner, name), name in vars(owner)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[row] += time.perf_counter() - start
        self.undo.append((owner, name, fn if own else None))
        setattr(owner, name, timed)

    def install(self):
        self._wrap(self.schedules, "_batch_p2p", "messages")
        self._wrap(self.schedules, "_wait_batch_p2p", "messages")
        schedule, opt = self.step.schedule, self.step.opt
        for name in ("forward_one_chunk", "backward_one_chunk"):
            self._wrap(schedule._stage, name, "compute")
        self._wrap(schedule, "_maybe_compute_loss", "compute")
        for name in ("step", "zero_grad"):
            self._wrap(opt, name, "optimizer")
        return self

    def remove(self):
        while self.undo:
            owner, name, fn = self.undo.pop()
            if fn is None:
                delattr(owner, name)          # the instance's wrapper: its class's method shows again
            else:
                setattr(owner, name, fn)

    def timed_step(self):
        start = time.perf_counter()
        self.step()
        self.step_seconds += time.perf_counter() - start
        self.steps += 1

    def rows(self):
        n = max(1, self.steps)
        rows = {k: v / n for k, v in self.seconds.items()}
        rows["other"] = self.step_seconds / n - sum(rows.values())
        rows["step"] = self.step_seconds / n
        return rows


def run(quick):
    world = MPI.COMM_WORLD
    torch, why_not = import_torch()
    dims = QUICK_MODEL if quick else BENCH_MODEL
    dist = init_gloo(torch, world) if torch else None
    rounds = 2 if quick else 5
    ours = {"ours": our_case(dims, world, tied=False), "ours, tied": our_case(dims, world, tied=True)}
    splits = {}
    if torch is not None:
        trainer = ours["ours"][2]
        step = torch_pipeline_step(torch, trainer, "1f1b", world.rank)
        splits["PyTorch"] = TorchSplit(torch, step)
    for fn, _, _ in ours.values():                      # warm-up, untimed
        world.Barrier()
        fn()
    for split in splits.values():
        world.Barrier()
        split.step()
    for _ in range(rounds):
        for name, (fn, prof, trainer) in ours.items():
            prof.install(trainer.grid.communicators())
            try:
                world.Barrier()
                with prof.step():
                    fn()
            finally:
                prof.remove()
        for split in splits.values():
            split.install()
            try:
                world.Barrier()
                split.timed_step()
            finally:
                split.remove()
    mine = {name: our_rows(prof.per_step()) for name, (_, prof, _) in ours.items()}
    mine.update({name: split.rows() for name, split in splits.items()})
    gathered = world.gather(mine, root=0)
    if dist is not None:
        dist.destroy_process_group()
    if world.rank:
        return None
    return report(gathered, why_not, ours["ours"][2], rounds)


def report(per_rank, why_not, trainer, rounds):
    """per_rank[r][run][row] -> the side-by-side table."""
    res = Result(why_not)
    runs = [r for r in ("ours", "PyTorch", "ours, tied") if r in per_rank[0]]
    m = LAYOUT["microbatches"]
    columns = ["per step"] + [f"{run}: stage {s}" for run in runs for s in range(len(per_rank))]
    table = []
    for row in ROWS + ("step",):
        table.append([row] + [ms(per_rank[s][run][row]) + (f" ({pct(per_rank[s][run][row] / per_rank[s][run]['step'])})"
                                                            if row != "step" else "")
                              for run in runs for s in range(len(per_rank))])
    stages = range(len(per_rank))
    slowest = {run: max(per_rank[s][run]["compute"] for s in stages) for run in runs}
    bubble = {run: slowest[run] * (len(per_rank) - 1) / m for run in runs}
    table.append(["the schedule's bubble, (p - 1) / m x the slowest stage's compute"] +
                 [ms(bubble[run]) for run in runs for _ in stages])
    table.append(["imbalance: the slowest stage's compute - this stage's"] +
                 [ms(slowest[run] - per_rank[s][run]["compute"]) for run in runs for s in stages])
    table.append(["messages beyond bubble and imbalance"] +
                 [ms(per_rank[s][run]["messages"] - bubble[run] - slowest[run] + per_rank[s][run]["compute"])
                  for run in runs for s in stages])
    res.figures = {"per_rank": per_rank, "bubble": bubble, "rounds": rounds}
    mcfg = trainer.mcfg
    res.table(f"A pp 2, 1F1B step by stage (wall seconds, mean of {rounds} alternating rounds); GPT hidden "
              f"{mcfg.d_model}, {mcfg.n_layer} layers, vocabulary {mcfg.vocab_size}, {trainer.cfg.batch_size} x "
              f"{mcfg.seq_len} tokens, {m} micro-batches, fp32, AdamW", columns, table,
              ["compute: forward, backward and loss of the micro-batches; messages: posting the sends and receives "
               "and waiting for them (the bubble included); tied sum: the all-reduce of the tied embedding's two "
               "copies (our tied run only: PyTorch's pipeline stages cannot share a weight).",
               "ours: hpcpar's profiler (--profile); PyTorch: its Schedule1F1B's forward_one_chunk / "
               "backward_one_chunk / loss, _batch_p2p and _wait_batch_p2p timed by wrappers.",
               "docs/performance.md, 'The pp 2 breakdown', explains how to read it."])
    if "PyTorch" in runs:
        steps = {run: max(per_rank[s][run]["step"] for s in range(len(per_rank))) for run in runs}
        res.notes.append(f"Slowest stage's step: ours {ms(steps['ours'])}, PyTorch {ms(steps['PyTorch'])} "
                         f"(ours / PyTorch {steps['ours'] / steps['PyTorch']:.2f}x), ours tied "
                         f"{ms(steps['ours, tied'])}; median compute per stage: ours "
                         f"{ms(statistics.median(per_rank[s]['ours']['compute'] for s in range(len(per_rank))))}, "
                         f"PyTorch {ms(statistics.median(per_rank[s]['PyTorch']['compute'] for s in range(len(per_rank))))}.")
    return res
