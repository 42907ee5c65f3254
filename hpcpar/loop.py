"""The training loop around ``Trainer.step``: resume, progress, metrics, logging, checkpoints, the trace,
and the records the end-of-run summary (summary.py) is made from.
"""
import contextlib
import json
import signal
import sys
import time

import numpy as np

from hpcpar import checkpoint, trace, watchdog
from hpcpar.checkpoint.consolidated import export, init_from
from hpcpar.gemm_speed import gemm_throughput
from hpcpar.pipeline.bubble import engine_window
from hpcpar.precision import grads_overflowed
from hpcpar.profiler import Profiler, report as profile_report
from hpcpar.runtime import EXIT_FAILURE, EXIT_PREEMPTED
from hpcpar.summary import summarize
from hpcpar.text import tokenizer_of
from hpcpar.train import Trainer

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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
            self.watch.enter("checkpoint")
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
        self.watch = watchdog.start(cfg, self.grid, STOP_SIGNALS)       # hangs and the shutdown deadline
        peak = self.measure_gemm_rate()
        bar = self._bar(start_step)
        metrics = open(cfg.metrics, "a" if start_step else "w") if (self.root and cfg.metrics) else None
        log_every = cfg.log_every or max(1, cfg.steps // 10)
        for c in self.trainer.communicators():
            c.stats.reset()
        tracer = self._start_trace()
        prof = Profiler().install(self.trainer.communicators()) if cfg.profile else None     # the first step measures the GEMM floor
        traced = range(start_step + 1, start_step + 1 + cfg.trace_steps)   # the first step pays for start-up
        status = 0
        try:
            for step in range(start_step, cfg.steps):
                if tracer:
                    tracer.enabled = step in traced
                self.watch.new_step(step)
                t0 = time.perf_counter()
                scale = t.scaler.scale                 # the loss scale this step runs with (fp16)
                with prof.step(floor=step == start_step) if prof else contextlib.nullcontext():
                    loss, norm, lr, skipped, stop = t.step(step, self.stop_requested)
                seconds = time.perf_counter() - t0
                self.watch.step_done(step - start_step, seconds)
                if tracer and tracer.enabled:
                    g = self.grid
                    trace.add_engine_step(tracer, step, t.engine, f"tp{g.tp_rank}.cp{g.cp_rank}.dp{g.dp_rank}")
                self.history.append((step, loss, norm, lr, seconds))
                val_loss = self.evaluate(step)
                if step > start_step:          # the first step pays for start-up: keep it out of the figures
                    self.timelines.append(t.engine.timeline)
                    g = self.grid
                    # one pipeline per (tp, cp, dp): its dp x cp rank tells the (cp, dp) pairs apart
                    self.windows.append((g.tp_rank, g.dp_cp_comm.rank, step) + engine_window(t.engine))
                if self.root:
                    record = {"step": step, "loss": loss, "lr": lr, "grad_norm": norm,
                              "tokens_per_s": t.tokens_per_step / seconds, "step_time_s": seconds,
                              "skipped": skipped}
                    if t.scaler.dynamic:
                        record["loss_scale"] = scale
                    if val_loss is not None:
                        record["val_loss"] = val_loss
                    if t.experts is not None:
                        record["experts"] = {k: v for k, v in t.experts.items() if k != "collapsed_layer"}
                        warning = t.expert_load.warning(t.experts, step)
                        if warning:
                            self._print(warning, err=True)
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
                    self.watch.checkpoint_after_stop()
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
        self.watch.enter("summary")
        if prof:
            prof.remove()
            per_rank = self.grid.world_comm.mpi.gather(prof.per_step(), root=0)     # once: pickled is fine
            if self.root:
                self._print(profile_report(per_rank))
        if tracer:
            trace.write(trace.stop(), self.grid.world_comm.mpi, cfg.trace)
            self._print(f"trace: {cfg.trace} (open in https://ui.perfetto.dev; hpcpar trace summary {cfg.trace})")
        self.summary(peak)
        self.watch.stop()
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
                "split_backward": s.split_backward, "tp": cfg.tp, "cp": cfg.cp, "pp": cfg.pp, "dp": cfg.dp,
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
        """Gather the figures of every rank and print them on rank 0 (summary.py)."""
        figures = summarize(self, peak)
        if figures is not None:
            self.figures = figures
