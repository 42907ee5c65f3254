"""(d) The engine against PyTorch eager, one thread each, at equal shapes.

Three measurements, each interleaved with its PyTorch counterpart in this one process:

1. one GPT-2 block, forward + backward, at hidden 256, 512 and 1024 (8 sequences of 128 tokens);
   PyTorch runs the same block written with torch.nn (tools/bench/torch_gpt.py), attention in the explicit
   form our engine computes, and once more with its fused ``scaled_dot_product_attention`` kernel;
2. where the time goes: the block's GEMMs timed alone at the same shapes in each library (numpy's
   BLAS, PyTorch's MKL), and the rest of the block (element-wise work, reductions, copies, memory);
3. one whole training step of the benchmark GPT (forward, backward, gradient clipping, AdamW) on one
   rank: ``Trainer.step`` against the same step in PyTorch, with the share of the step spent in GEMMs
   and the model FLOPs utilisation against the square-GEMM peak measured in this run.
"""
import numpy as np

from hpcpar.tools.bench.common import (BENCH_MODEL, Result, import_torch, interleave, ms, pct, ratio, spread, summary,
                                 torch_tensor)
from hpcpar.tools.bench.gemm import block_gemms, head_gemms, time_gemms

BLOCK_SHAPES = [(256, 8, 128), (512, 8, 128), (1024, 8, 128)]       # hidden, sequences, tokens each
QUICK_SHAPES = [(64, 2, 32)]
TARGET = 1.10


def block_cases(hidden, batch, seq, torch):
    """name -> one forward + backward of a block (ours; torch explicit; torch SDPA)."""
    from hpcpar import backend
    from hpcpar.nn.block import TransformerBlock
    from hpcpar.nn.gpt import GPTConfig
    cfg = GPTConfig(vocab_size=64, seq_len=seq, n_layer=4, n_head=max(1, hidden // 64), d_model=hidden)
    ours = TransformerBlock(cfg, 0, seed=0, dtype=np.float32)
    x = np.random.default_rng(0).standard_normal((batch, seq, hidden)).astype(np.float32)
    dy = 0.1 * x
    x_dev, dy_dev = backend.xp().asarray(x), backend.xp().asarray(dy)     # on the GPU under cupy (gpu.py)

    def ours_step():
        y, cache = ours.forward(x_dev)
        ours.backward(dy_dev, cache)
    cases = {"ours": ours_step}
    if torch is not None:
        from hpcpar.tools.bench.torch_gpt import Block
        tx, tdy = torch_tensor(torch, x).requires_grad_(), torch_tensor(torch, dy)
        for name, sdpa in (("torch", False), ("torch_sdpa", True)):
            block = Block(cfg, sdpa=sdpa)
            cases[name] = (lambda block=block: block(tx).backward(tdy))
    return cases


def bench_blocks(res, shapes, rounds, torch):
    rows, parts = [], []
    for hidden, batch, seq in shapes:
        times = interleave(block_cases(hidden, batch, seq, torch), rounds)
        gemm_s = time_gemms(block_gemms(hidden, batch, seq), max(2, rounds // 2), torch)
        ours_gemm = sum(s for (lib, _, _), s in gemm_s.items() if lib == "numpy")
        key = f"hidden {hidden}, {batch} x {seq} tokens"
        res.figures[key] = {"ours_s": min(times["ours"]), "gemm_ours_s": ours_gemm}
        if torch is None:
            rows.append([str(hidden), f"{batch} x {seq}", ms(min(times["ours"]))] + ["-"] * 5)
            continue
        torch_gemm = sum(s for (lib, _, _), s in gemm_s.items() if lib == "torch")
        fig = summary(times, "ours", "torch")
        fig.update(sdpa=summary(times, "ours", "torch_sdpa"), gemm_torch_s=torch_gemm)
        res.figures[key].update(fig)
        rows.append([str(hidden), f"{batch} x {seq}", ms(fig["ours_s"]), ms(fig["theirs_s"]), ratio(fig["ratio"]),
                     spread(fig), ms(fig["sdpa"]["theirs_s"]), ratio(fig["sdpa"]["ratio"])])
        rest_ours, rest_torch = fig["ours_s"] - ours_gemm, fig["theirs_s"] - torch_gemm
        parts.append([str(hidden), ms(ours_gemm), ms(torch_gemm), ratio(ours_gemm / torch_gemm),
                      ms(rest_ours), ms(rest_torch), ratio(rest_ours / rest_torch)])
        res.target(f"block forward+backward, hidden {hidden}: ours / PyTorch eager", f"<= {TARGET:.2f}x",
                   ratio(fig["ratio"]), fig["ratio"] <= TARGET)
    res.table("One transformer block, forward + backward (CPU time, best of the interleaved rounds)",
              ["hidden", "tokens", "ours", "PyTorch", "ours / PyTorch", "median of the rounds' ratios (range)",
               "PyTorch, fused SDPA", "ours / SDPA"], rows,
              ["PyTorch computes attention the way our engine does (Q K^T, mask, softmax, times V); "
               "'fused SDPA' is its scaled_dot_product_attention kernel, a different algorithm, for reference."])
    if parts:
        res.table("Where the block's time goes: its GEMMs timed alone at the same shapes, and the rest",
                  ["hidden", "GEMMs: ours (numpy BLAS)", "GEMMs: PyTorch (MKL)", "ratio",
                   "rest: ours", "rest: PyTorch", "ratio"], parts,
                  ["rest = block time - GEMM time: element-wise work, reductions, copies, fresh memory.",
                   "The GEMM ratio is the two BLAS libraries' (table (a)); the engine's own code is the rest."])


def step_cases(torch, dims, optimizer="adamw", compiled=False):
    """name -> one training step of a GPT of ``dims`` (ours: Trainer; torch: the same in PyTorch, with
    the same optimizer and clipping; with ``compiled`` also "torch_compile", the model under
    torch.compile's default inductor backend), our trainer, and why the compiled case is missing (or None)."""
    from mpi4py import MPI

    from hpcpar.training.config import TrainConfig
    from hpcpar.training.step import Trainer
    cfg = TrainConfig(model="small", untied=True, steps=10 ** 6, progress=False, optimizer=optimizer, **dims)
    trainer = Trainer(cfg, MPI.COMM_SELF)
    counter = iter(range(10 ** 6))
    cases, why_not = {"ours": lambda: trainer.step(next(counter))}, None
    if torch is not None:
        from hpcpar.tools.bench.torch_gpt import Stage, loss_fn, torch_optimizer
        ids, targets = (torch_tensor(torch, a).long() for a in trainer.data.batch(0, range(cfg.batch_size)))

        def torch_case(model):
            opt = torch_optimizer(model, cfg)

            def torch_step():
                loss_fn(model(ids), targets).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
                opt.zero_grad()
            return torch_step
        cases["torch"] = torch_case(Stage(trainer.mcfg))
        if compiled:
            step = torch_case(torch.compile(Stage(trainer.mcfg)))
            try:
                step()                          # compiles here, untimed
                cases["torch_compile"] = step
            except Exception as err:  # noqa: BLE001 - no compiler, no inductor: the row says why
                why_not = f"torch.compile failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return trainer, cases, why_not


def bench_step(res, rounds, torch, quick):
    import time

    from hpcpar.flops import gpt_step_flops
    from hpcpar.gemm_speed import gemm_rate
    dims = dict(hidden=32, layers=2, heads=2, seq_len=32, vocab=64, batch_size=4) if quick else BENCH_MODEL
    trainer, cases, _ = step_cases(torch, dims)
    m, B = trainer.mcfg, trainer.cfg.batch_size
    times = interleave(cases, rounds)
    peak = gemm_rate("float32", n=256 if quick else 2048, seconds=0.1 if quick else 0.6, clock=time.process_time)
    gemms = block_gemms(m.d_model, B, m.seq_len, m.n_head, m.d_ff) * m.n_layer + \
        head_gemms(m.d_model, m.vocab_size, B * m.seq_len)
    gemm_s = time_gemms(list({g.name: g for g in gemms}.values()), max(2, rounds // 2), torch)
    counts = {g.name: sum(1 for h in gemms if h.name == g.name) for g in gemms}
    flops, tokens = gpt_step_flops(m, trainer.tokens_per_step), trainer.tokens_per_step

    def column(step_s, gemm_s_total):
        return [ms(step_s), f"{tokens / step_s:,.0f}", f"{ms(gemm_s_total)} = {pct(gemm_s_total / step_s)}",
                f"{flops / step_s / 1e9:.0f} GFLOP/s = {pct(flops / step_s / peak)}"]
    mine = min(times["ours"])
    ours_gemm = sum(s * counts[n] for (lib, _, n), s in gemm_s.items() if lib == "numpy")
    cols = [["step", "tokens/s", "GEMMs (timed alone at the step's shapes), share of the step",
             f"model FLOP/s, share of the {peak / 1e9:.0f} GFLOP/s peak"], column(mine, ours_gemm)]
    header = ["", "ours"]
    res.figures["gpt_step"] = {"ours_s": mine, "gemm_ours_s": ours_gemm, "flops": flops, "peak_flops": peak}
    if torch is not None:
        fig = summary(times, "ours", "torch")
        torch_gemm = sum(s * counts[n] for (lib, _, n), s in gemm_s.items() if lib == "torch")
        cols += [column(fig["theirs_s"], torch_gemm),
                 [f"{ratio(fig['ratio'])}; median of rounds {spread(fig)}", ratio(fig["theirs_s"] / mine),
                  ratio(ours_gemm / torch_gemm), ""]]
        header += ["PyTorch", "ours / PyTorch"]
        res.figures["gpt_step"].update(fig, gemm_torch_s=torch_gemm)
        res.target("GPT training step (one rank): ours / PyTorch eager", f"<= {TARGET:.2f}x", ratio(fig["ratio"]),
                   fig["ratio"] <= TARGET)
    rows = [list(row) for row in zip(*cols)]
    res.table(f"One training step of the benchmark GPT on one rank (hidden {m.d_model}, {m.n_layer} layers, "
              f"{m.n_head} heads, vocabulary {m.vocab_size}, {B} x {m.seq_len} tokens; forward, backward, "
              "clipping, AdamW)", header, rows,
              ["ours: Trainer.step (it also draws the batch); PyTorch: the same model in torch.nn, same batch, "
               "clip_grad_norm_ and torch.optim.AdamW.",
               "peak: numpy's square float32 GEMM (hpcpar.gemm_speed.gemm_rate), CPU time, measured in this run."])


def run(quick):
    torch, why_not = import_torch()
    res = Result(why_not)
    bench_blocks(res, QUICK_SHAPES if quick else BLOCK_SHAPES, 2 if quick else 7, torch)
    bench_step(res, 2 if quick else 6, torch, quick)
    return res
