"""(e) Our pipeline (GPipe, 1F1B, interleaved, ZB-V, DualPipeV; pp = 2), tensor-parallel (tp = 2) and data-parallel
(dp = 2, and dp = 2 with ZeRO-3) steps against PyTorch's own, ``torch.distributed.pipelining``, DTensor
tensor parallelism, DistributedDataParallel and FSDP2's ``fully_shard`` on the gloo backend: same model, same batch, same two ranks (the PyTorch build has no MPI backend, so its ranks talk over gloo's TCP).

Both sides live in the same two processes: rank r of our MPI job is rank r of PyTorch's gloo group,
and the ten steps (ours and PyTorch's, for each of the five layouts) take turns round after round,
each after a barrier, each timed on the slowest rank.  The model is the benchmark GPT (common.py) -
smaller than the 8-layer one of the one-rank step (step.py), so that `make bench` stays short; one step is a
forward, a backward and an AdamW update (no clipping on either side: PyTorch's pipeline has no global
gradient norm).

PyTorch's side, as its documentation sets it up: pipeline stages built by hand (embedding and the
first half of the blocks on rank 0; the rest, the final LayerNorm and the output layer on rank 1),
``ScheduleGPipe`` / ``Schedule1F1B`` with 8 micro-batches; tensor parallelism with
``ColwiseParallel`` on the q, k, v and c_fc projections and ``RowwiseParallel`` on the two output
projections (Megatron's split, like ours), a vocabulary-parallel embedding and output layer, and the
loss under ``loss_parallel`` - the counterpart of our vocabulary-parallel cross-entropy.
"""
import os
import socket
import statistics
import time

from mpi4py import MPI

from hpcpar.tools.bench.common import (BENCH_MODEL, PEER_ROUNDS, Result, import_torch, interleave, ms, ratio, slowest_rank,
                                 spread, summary, torch_tensor)

LAYOUTS = {"pp 2, GPipe": dict(pp=2, schedule="gpipe", microbatches=8),
           "pp 2, 1F1B": dict(pp=2, schedule="1f1b", microbatches=8),
           "pp 2, interleaved": dict(pp=2, schedule="interleaved", microbatches=8, chunks=2),
           "pp 2, ZB-V": dict(pp=2, schedule="zb-v", microbatches=8, chunks=2),
           "pp 2, DualPipeV": dict(pp=2, schedule="dualpipev", microbatches=8, chunks=2),
           "tp 2": dict(tp=2),
           "dp 2": dict(dp=2),
           "dp 2, ZeRO-3": dict(dp=2, zero=3)}
TARGETS = {"pp 2, 1F1B": 0.85, "pp 2, ZB-V": 0.85, "pp 2, DualPipeV": 0.85, "dp 2": 0.85,
           "tp 2": 0.75}                                          # others: faster than PyTorch
QUICK_MODEL = dict(hidden=32, layers=4, heads=2, seq_len=16, vocab=64, batch_size=8)


def our_step(dims, layout, world):
    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    cfg = TrainConfig(model="small", untied=True, steps=10 ** 6, progress=False, grad_clip=0.0, **dims, **layout)
    trainer = Trainer(cfg, world)
    counter = iter(range(10 ** 6))
    return trainer, (lambda: trainer.step(next(counter)))


def init_gloo(torch, world):
    """PyTorch's process group over the same ranks, on a TCP port rank 0 picked."""
    import torch.distributed as dist
    port = None
    if world.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = world.bcast(port, root=0)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=world.rank,
                            world_size=world.size)
    return dist


def torch_pipeline_step(torch, trainer, schedule_name, rank):
    """PyTorch's pipeline over 2 ranks; interleaved: 4 stages, rank r holding stages r and r + 2; the V
    schedules: 4 stages, rank r holding stages r and 3 - r (the loss on rank 0)."""
    from torch.distributed import pipelining as pipe
    from torch.distributed.pipelining import PipelineStage

    from hpcpar.tools.bench.torch_gpt import Stage, adamw, loss_fn
    m, cfg = trainer.mcfg, trainer.cfg
    n = 2 if schedule_name in ("gpipe", "1f1b") else 4
    per = m.n_layer // n
    ids_of = trainer.schedule.holders()                 # virtual stage -> (rank, chunk): ours, and theirs
    mine = sorted(s for s, (r, _) in ids_of.items() if r == rank)
    models = [Stage(m, range(s * per, (s + 1) * per), first=s == 0, last=s == n - 1) for s in mine]
    stages = [PipelineStage(model, s, n, torch.device("cpu")) for model, s in zip(models, mine)]
    multi = {"interleaved": pipe.ScheduleInterleaved1F1B, "zb-v": pipe.ScheduleZBVZeroBubble,
             "dualpipev": pipe.ScheduleDualPipeV}
    if n == 4:
        schedule = multi[schedule_name](stages, n_microbatches=cfg.microbatches, loss_fn=loss_fn)
    else:
        Schedule = pipe.ScheduleGPipe if schedule_name == "gpipe" else pipe.Schedule1F1B
        schedule = Schedule(stages[0], n_microbatches=cfg.microbatches, loss_fn=loss_fn)
    first, last = trainer.schedule.ends()
    opt = adamw(torch.nn.ModuleList(models), cfg)
    ids, targets = (torch_tensor(torch, a).long() for a in trainer.data.batch(0, range(cfg.batch_size)))

    def step():
        inputs = (ids,) if rank == first else ()
        schedule.step(*inputs, **(dict(target=targets, losses=[]) if rank == last else {}))
        opt.step()
        opt.zero_grad()
    step.schedule, step.opt = schedule, opt           # for the pp 2 breakdown (pp_breakdown.py)
    return step


def half_batch_step(torch, trainer, rank, model):
    """One AdamW step of ``model`` (wrapped for data parallelism) on this rank's half of the batch."""
    from hpcpar.tools.bench.torch_gpt import adamw, loss_fn
    opt = adamw(model, trainer.cfg)
    half = trainer.cfg.batch_size // 2
    ids, targets = (torch_tensor(torch, a).long()
                    for a in trainer.data.batch(0, range(rank * half, (rank + 1) * half)))

    def step():
        loss_fn(model(ids), targets).backward()
        opt.step()
        opt.zero_grad()
    return step


def torch_data_parallel_step(torch, trainer, rank):
    """DistributedDataParallel over 2 ranks, each on its half of the batch (its gradient buckets are
    all-reduced during the backward, as ours are)."""
    from torch.nn.parallel import DistributedDataParallel

    from hpcpar.tools.bench.torch_gpt import Stage
    return half_batch_step(torch, trainer, rank, DistributedDataParallel(Stage(trainer.mcfg)))


def torch_fully_sharded_step(torch, trainer, rank):
    """FSDP2 (``fully_shard``) over 2 ranks: each block a unit, the rest (embeddings, head) the root's,
    gathered before use and resharded after the forward - the counterpart of our --zero 3."""
    from torch.distributed.fsdp import fully_shard

    from hpcpar.tools.bench.torch_gpt import Stage
    model = Stage(trainer.mcfg)
    for block in model.h:
        fully_shard(block)
    fully_shard(model)
    return half_batch_step(torch, trainer, rank, model)


def torch_tensor_parallel_step(torch, trainer):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, loss_parallel, parallelize_module

    from hpcpar.tools.bench.torch_gpt import Stage, adamw, loss_fn
    m, cfg = trainer.mcfg, trainer.cfg
    model = Stage(m, fused_qkv=False)
    plan = {"wte": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(m.n_layer):
        plan.update({f"h.{i}.attn.{p}": ColwiseParallel() for p in ("q", "k", "v")})
        plan.update({f"h.{i}.attn.c_proj": RowwiseParallel(), f"h.{i}.c_fc": ColwiseParallel(),
                     f"h.{i}.c_proj": RowwiseParallel()})
    parallelize_module(model, init_device_mesh("cpu", (2,)), plan)
    opt = adamw(model, cfg)
    ids, targets = (torch_tensor(torch, a).long() for a in trainer.data.batch(0, range(cfg.batch_size)))

    def step():
        with loss_parallel():
            loss_fn(model(ids), targets).backward()
        opt.step()
        opt.zero_grad()
    return step


def run(quick):
    world = MPI.COMM_WORLD
    torch, why_not = import_torch()
    dims = QUICK_MODEL if quick else BENCH_MODEL
    dist = init_gloo(torch, world) if torch else None
    cases = {}
    for name, layout in LAYOUTS.items():
        trainer, cases[f"ours {name}"] = our_step(dims, layout, world)
        if torch is None:
            continue
        cases[f"PyTorch {name}"] = torch_tensor_parallel_step(torch, trainer) if "tp" in layout else \
            torch_fully_sharded_step(torch, trainer, world.rank) if layout.get("zero") == 3 else \
            torch_data_parallel_step(torch, trainer, world.rank) if "dp" in layout else \
            torch_pipeline_step(torch, trainer, layout["schedule"], world.rank)
    times = slowest_rank(world, interleave(cases, 2 if quick else PEER_ROUNDS + 1, time.perf_counter, world.Barrier))
    if dist is not None:
        dist.destroy_process_group()
    if world.rank:
        return None
    m = trainer.mcfg
    res = Result(why_not)
    rows = []
    for name in LAYOUTS:
        row = [name, ms(statistics.median(times[f"ours {name}"]))]
        if torch is not None:
            fig = summary(times, f"ours {name}", f"PyTorch {name}")
            row += [ms(fig["theirs_median_s"]), spread(fig), ratio(fig["ratio"])]
            res.figures[name] = fig
            goal = TARGETS.get(name, 1.0)
            res.target(f"{name} step: ours / PyTorch (gloo), median of rounds", f"<= {goal:.2f}x", spread(fig),
                       fig["ratio_median_paired"] <= goal)
        rows.append(row)
    res.table(f"One training step on 2 ranks (wall time of the slowest rank, median of the interleaved rounds); "
              f"GPT hidden {m.d_model}, {m.n_layer} layers, {m.n_head} heads, vocabulary {m.vocab_size}, "
              f"{dims['batch_size']} x {m.seq_len} tokens, fp32",
              ["layout", "ours (MPI)", "PyTorch (gloo)", "ours / PyTorch: median of the rounds (range)",
               "best rounds' ratio"]
              if torch else ["layout", "ours (MPI)"],
              rows, ["pipeline: 8 micro-batches of 2 sequences (interleaved: 2 chunks per rank, PyTorch's "
                     "ScheduleInterleaved1F1B on 4 stages; ZB-V and DualPipeV: 2 chunks per rank as a V, PyTorch's "
                     "ScheduleZBVZeroBubble and ScheduleDualPipeV); tensor parallel: the whole batch at once; data "
                     "parallel: 8 sequences per rank, PyTorch's DistributedDataParallel; ZeRO-3: ours with --zero 3, "
                     "PyTorch's FSDP2 fully_shard on each block and the root.",
                     "Each round's two steps are paired: the ratio column is the median of those per-round ratios "
                     "with the lowest and highest; the last column the ratio of the two best rounds.",
                     "Both ranks share the machine's two cores; gloo waits in blocking socket calls, MPI spins."])
    return res
