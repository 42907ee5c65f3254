"""The training loop around ``Trainer.step``: progress, metrics, logging and the end-of-run summary.

The summary puts the numbers a user needs side by side: the loss against the data's entropy floor,
tokens per second, model FLOPs utilisation against the GEMM rate measured on these very ranks, the
measured pipeline bubble against the simulator's prediction for the measured F/B/W times, and the
bytes each kind of group moved.
"""
import json
import signal
import statistics
import sys
import time

import numpy as np

from hpcpar import checkpoint, trace
from hpcpar.checkpoint.consolidated import export, init_from
from hpcpar.flops import gemm_throughput, gpt_step_flops, mlp_step_flops
from hpcpar.pipeline.bubble import pipeline_bubble
from hpcpar.precision import grads_overflowed
from hpcpar.runtime import EXIT_FAILURE, EXIT_PREEMPTED
from hpcpar.text import tokenizer_of
from hpcpar.train import Trainer

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def engine_window(engine):
    """(start, end, busy seconds in F/B/W) of the step the engine just ran, on the shared clock."""
    busy = sum(end - start for start, end, op, _, _ in engine.timeline if op in ("F", "B", "W"))
    return engine.started, engine.started + (engine.timeline[-1][1] if engine.timeline else 0.0), busy


def mean_costs(timelines):
    """Mean seconds of one F, B and W action over the given timelines."""
    sums, counts = {"F": 0.0, "B": 0.0, "W": 0.0}, {"F": 0, "B": 0, "W": 0}
    for tl in timelines:
        for start, end, op, _, _ in tl:
            if op in sums:
                sums[op] += end - start
                counts[op] += 1
    return {op: sums[op] / counts[op] if counts[op] else 0.0 for op in sums}


def simulated_bubble(schedule, costs):
    from hpcpar.pipeline.simulate import Costs, simulate
    if schedule.stages == 1:
        return 0.0
    return simulate(schedule, Costs(F=costs["F"], B=costs["B"], W=costs["W"])).bubble


class Loop:
    def __init__(self, cfg, comm=None, out=sys.stdout):
        self.trainer = Trainer(cfg, comm)
        self.cfg, self.out = self.trainer.cfg, out
        self.grid = self.trainer.grid
        self.root = self.grid.rank_id == 0
        self.history = []          # (step, loss, grad_norm, lr, seconds)
        self.timelines = []        # this rank's engine timelines (steps after the first)
        self.windows = []          # (tp, dp, step, start, end, busy) of this rank's steps

    def measure_gemm_rate(self):
        """Aggregate GEMM FLOP/s of all ranks running at once (they share the machine's cores)."""
        self.grid.world_comm.barrier()
        rate = gemm_throughput(self.cfg.dtype, seconds=0.3)
        return float(self.grid.world_comm.all_reduce(np.array([rate]))[0])

    def start(self):
        """Resume from the latest checkpoint, or load initial weights; returns the first step."""
        cfg = self.cfg
        if cfg.resume:
            done = checkpoint.load_checkpoint(self.trainer, cfg.resume)
            if done is not None:
                self._print(f"resumed from {checkpoint.latest_checkpoint(cfg.resume)} after step {done}")
                return done
            self._print(f"no checkpoint in {cfg.resume} yet: starting from step 0")
        if cfg.init_from:
            init_from(self.trainer, cfg.init_from)
        return 0

    def save(self, completed):
        directory = self.cfg.save or self.cfg.resume
        if directory:
            path = checkpoint.save_checkpoint(self.trainer, directory, completed, self.cfg.keep)
            self._print(f"checkpoint: {path}")

    def _make_output_dirs(self):
        """Rank 0 writes these files; their folders may not exist yet (agreed: no rank runs ahead)."""
        from pathlib import Path
        from hpcpar.runtime import agree
        error = None
        if self.root:
            try:
                for f in (self.cfg.metrics, self.cfg.trace, self.cfg.summary_json, self.cfg.export):
                    if f:
                        Path(f).parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                error = err
        agree(self.grid.world_comm.mpi, error)

    def _stop_handler(self):
        """SIGTERM / SIGUSR1 (Slurm's --signal) only set a flag: the step in progress finishes, every
        rank agrees in the step's all-reduce, and the loop saves and exits with EXIT_PREEMPTED."""
        self.stop_requested = False

        def handler(signum, frame):
            self.stop_requested = True
        for sig in STOP_SIGNALS:
            signal.signal(sig, handler)

    def run(self):
        cfg, t = self.cfg, self.trainer
        self._make_output_dirs()
        start_step = self.start()
        self._stop_handler()
        peak = self.measure_gemm_rate()
        bar = self._bar(start_step)
        metrics = open(cfg.metrics, "a" if start_step else "w") if (self.root and cfg.metrics) else None
        log_every = cfg.log_every or max(1, cfg.steps // 10)
        for c in self.grid.communicators():
            c.stats.reset()
        tracer = self._start_trace()
        traced = range(start_step + 1, start_step + 1 + cfg.trace_steps)   # the first step pays for start-up
        status = 0
        try:
            for step in range(start_step, cfg.steps):
                if tracer:
                    tracer.enabled = step in traced
                t0 = time.perf_counter()
                scale = t.scaler.scale                 # the loss scale this step runs with (fp16)
                loss, norm, lr, skipped, stop = t.step(step, self.stop_requested)
                seconds = time.perf_counter() - t0
                if tracer and tracer.enabled:
                    g = self.grid
                    trace.add_engine_step(tracer, step, t.engine, f"tp{g.tp_rank}.dp{g.dp_rank}")
                self.history.append((step, loss, norm, lr, seconds))
                val_loss = self.evaluate(step)
                if step > start_step:          # the first step pays for start-up: keep it out of the figures
                    self.timelines.append(t.engine.timeline)
                    g = self.grid
                    self.windows.append((g.tp_rank, g.dp_rank, step) + engine_window(t.engine))
                if self.root:
                    record = {"step": step, "loss": loss, "lr": lr, "grad_norm": norm,
                              "tokens_per_s": t.tokens_per_step / seconds, "step_time_s": seconds,
                              "skipped": skipped}
                    if t.scaler.dynamic:
                        record["loss_scale"] = scale
                    if val_loss is not None:
                        record["val_loss"] = val_loss
                    if metrics:
                        metrics.write(json.dumps(record) + "\n")
                        metrics.flush()
                    if bar is not None:
                        bar.set_postfix(loss=f"{loss:.4f}")
                        bar.update(1)
                    if (step + 1) % log_every == 0 or step == cfg.steps - 1:
                        self._print(f"step {step + 1:>5}/{cfg.steps}  loss {loss:.12g}  grad_norm {norm:.4g}  "
                                    f"lr {lr:.3g}  {seconds * 1e3:.1f} ms")
                    if val_loss is not None:
                        self._print(f"step {step + 1:>5}/{cfg.steps}  val_loss {val_loss:.12g}")
                if skipped and cfg.nonfinite == "stop" and not grads_overflowed(t.scaler, loss, norm):
                    self._print(f"hpcpar: non-finite loss or gradient at step {step + 1}: stopping "
                                f"(the weights are those of step {step})", err=True)
                    self.save(step)
                    status = EXIT_FAILURE
                    break
                if stop:
                    self.save(step + 1)
                    self._print(f"hpcpar: stopped by a signal after step {step + 1}; resume with --resume",
                                err=True)
                    status = EXIT_PREEMPTED
                    break
                if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
                    self.save(step + 1)
            else:
                if start_step < cfg.steps:
                    self.save(cfg.steps)
                if cfg.export:
                    export(t, cfg.export, tokenizer_of(cfg.data))
        finally:
            if bar is not None:
                bar.close()
            if metrics:
                metrics.close()
        if tracer:
            trace.write(trace.stop(), self.grid.world_comm.mpi, cfg.trace)
            self._print(f"trace: {cfg.trace} (open in https://ui.perfetto.dev; hpcpar trace summary {cfg.trace})")
        self.summary(peak)
        return status

    def evaluate(self, step):
        """Collective: the validation loss after ``step`` every --eval-every steps and at the end, else None."""
        every = self.cfg.eval_every
        if every and ((step + 1) % every == 0 or step == self.cfg.steps - 1):
            return self.trainer.evaluate(self.cfg.eval_batches)
        return None

    def _start_trace(self):
        cfg, g, s = self.cfg, self.grid, self.trainer.schedule
        if not cfg.trace:
            return None
        meta = {"schedule": s.name, "stages": s.stages, "microbatches": s.microbatches, "chunks": s.chunks,
                "split_backward": s.split_backward, "tp": cfg.tp, "pp": cfg.pp, "dp": cfg.dp,
                "model": cfg.model, "dtype": cfg.dtype}
        label = f"rank {g.rank_id} {g.coords}"
        return trace.start(label, g.world_comm.mpi, meta)

    def _bar(self, start):
        if not (self.root and self.cfg.progress):
            return None
        from tqdm import tqdm
        return tqdm(total=self.cfg.steps, initial=start, desc="train", unit="step", mininterval=0.5,
                    file=sys.stderr, dynamic_ncols=True)

    def _print(self, text, err=False):
        """Rank 0 speaks for the job."""
        if self.root:
            print(text, file=sys.stderr if err else self.out, flush=True)

    def summary(self, peak):
        """Gather the figures of every rank and print them on rank 0."""
        cfg, t, g = self.cfg, self.trainer, self.grid
        steps = max(1, len(self.history) - 1)
        n = max(1, len(self.history))
        volume = {c.name: c.stats.total_bytes() / n for c in g.communicators()}
        blocked = {c.name: c.stats.total_seconds() / n for c in g.communicators()}
        mine = {"windows": self.windows, "volume": volume, "blocked": blocked,
                "costs": mean_costs(self.timelines)}
        everyone = g.world_comm.mpi.gather(mine, root=0)       # once per run: a pickled gather is fine
        if not self.root or not self.history:
            return
        times = [h[4] for h in self.history[1:]] or [self.history[0][4]]
        step_time = statistics.median(times)
        loss = self.history[-1][1]
        flops = gpt_step_flops(t.mcfg, t.tokens_per_step) if cfg.model != "mlp" else \
            mlp_step_flops(t.mcfg, cfg.batch_size)
        groups = {}
        for r in everyone:
            for name, b in r["volume"].items():
                groups[name] = groups.get(name, 0.0) + b
        costs = {op: statistics.fmean(r["costs"][op] for r in everyone) for op in ("F", "B", "W")}
        blocked = {name: statistics.fmean(r["blocked"].get(name, 0.0) for r in everyone) for name in groups}
        measured = pipeline_bubble([w for r in everyone for w in r["windows"]])
        simulated = simulated_bubble(t.schedule, costs)
        floor = getattr(t.data, "entropy_floor", None)
        n_params = sum(p.data.size for p in t.parameters())
        lines = [
            f"hpcpar train: {len(self.history)} steps"
            + (f" (steps {self.history[0][0] + 1}-{self.history[-1][0] + 1})" if self.history[0][0] else "")
            + f", {cfg.model} model, tp {cfg.tp} x pp {cfg.pp} x dp {cfg.dp} "
            f"= {g.world} ranks, {cfg.schedule} with {cfg.microbatches} micro-batch"
            + ("es" if cfg.microbatches > 1 else "")
            + (f" x {cfg.chunks} chunks" if cfg.chunks > 1 else "") + f", {cfg.dtype}"
            + (f" masters, {cfg.precision} compute" if cfg.precision != "fp32" else ""),
            f"  loss        {loss:.6g}" + (f"   (entropy floor {floor:.6g}: {100 * (loss / floor - 1):+.1f}%)"
                                           if floor else ""),
            f"  throughput  {t.tokens_per_step / step_time:,.0f} tokens/s, {step_time * 1e3:.1f} ms/step (median)",
            f"  MFU         {100 * flops / step_time / peak:.1f}% of the GEMM rate measured on these {g.world} ranks "
            f"({peak / 1e9:.1f} GFLOP/s together; {flops / 1e9:.2f} GFLOP per step)",
            f"  bubble      measured {100 * measured:.1f}% of pipeline time idle; simulated "
            f"{100 * simulated:.1f}% for the measured F {costs['F'] * 1e3:.2f} ms, "
            f"B {costs['B'] * 1e3:.2f} ms, W {costs['W'] * 1e3:.2f} ms",
            "  bytes/step  " + (", ".join(f"{name} {_size(groups[name])}" for name in ("tp", "pp", "dp", "embed", "world")
                                          if groups.get(name)) or "none: a single rank communicates with nobody")
            + (" (payload handed to MPI, all ranks)" if g.world > 1 else ""),
            *(["  comm time   " + ", ".join(f"{name} {1e3 * sec:.1f} ms" for name, sec in blocked.items() if sec)
               + f" per step and rank inside MPI calls ({100 * sum(blocked.values()) / step_time:.0f}% of the step)"]
              if g.world > 1 else []),
            f"  parameters  {n_params:,} on rank 0 of this layout",
        ]
        self._print("\n".join(lines))
        self.figures = {"loss": loss, "entropy_floor": floor, "step_time_s": step_time,
                        "tokens_per_s": t.tokens_per_step / step_time, "mfu": flops / step_time / peak,
                        "gemm_flops_per_s": peak, "model_flops_per_step": flops,
                        "bubble_measured": measured, "bubble_simulated": simulated,
                        "costs_s": costs, "bytes_per_step": groups, "comm_seconds_per_step": blocked,
                        "steps": steps,
                        "layout": {"tp": cfg.tp, "pp": cfg.pp, "dp": cfg.dp, "world": g.world, "chunks": cfg.chunks,
                                   "schedule": cfg.schedule, "microbatches": cfg.microbatches},
                        "tokens_per_step": t.tokens_per_step, "step_times_s": times}
        if cfg.summary_json:
            with open(cfg.summary_json, "w") as f:
                json.dump(self.figures, f, indent=1)


def _size(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
