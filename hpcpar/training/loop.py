"""The training loop around ``Trainer.step``.

``Loop.run`` is the step loop alone: resume, the steps, the records the end-of-run summary (summary.py)
is made from, checkpoints, and stopping (a signal, a non-finite loss).  Everything else watches the loop
through the hooks of ``Observer`` (observers.py), one class each: the watchdog, the tracer, the
profiler, the FP8 figures, the evaluation on validation data, the metrics file, and the progress bar
with the loss lines.  A new watcher is a class with the hooks it needs, added to ``Loop.observers``.
"""
import contextlib
import signal
import sys
import time

import numpy as np

from hpcpar import checkpoint
from hpcpar.checkpoint.consolidated import export, init_from
from hpcpar.gemm_speed import gemm_throughput
from hpcpar.pipeline.bubble import engine_window
from hpcpar.precision import grads_overflowed
from hpcpar.runtime import EXIT_FAILURE, EXIT_PREEMPTED
from hpcpar.training import outputs, recovery
from hpcpar.training.observers import (STOP_SIGNALS, Evaluation, Fp8Report, Metrics, Profiling, Progress, Tracing,
                                       Watchdog)
from hpcpar.training.summary import summarize
from hpcpar.training.text import tokenizer_of
from hpcpar.training.step import Trainer


class Loop:
    def __init__(self, cfg, comm=None, out=None, relayout=None):
        if cfg.on_failure == "shrink":
            recovery.refuse()      # an MPI that cannot go on after a rank dies: one line, before any collective
        self.trainer = Trainer(cfg, comm)
        self.cfg, self.out = self.trainer.cfg, out or sys.stdout     # (the stdout of now, not of the import)
        self.grid = self.trainer.grid
        self.root = self.grid.rank_id == 0
        self.history = []          # (step, loss, grad_norm, lr, seconds)
        self.timelines = []        # this rank's engine timelines (steps after the first)
        self.windows = []          # (tp, dp, step, start, end, busy) of this rank's steps
        self.peak = None           # the GEMM rate of all ranks, measured once
        # --on-failure shrink: the survivors of a failure rebuild the job and go on (recovery.py);
        # ``relayout`` is the planner's rule for their layout (the command line passes it)
        self.recovery = recovery.Recovery(self, relayout) if self.cfg.on_failure == "shrink" else None

    def measure_gemm_rate(self):
        """Aggregate GEMM FLOP/s of all ranks running at once (they share the machine's cores)."""
        self.grid.world_comm.barrier()
        rate = gemm_throughput(self.cfg.dtype, seconds=0.3)
        return float(self.grid.world_comm.all_reduce(np.array([rate]))[0])

    def start(self):
        """Resume from the latest checkpoint, or load initial weights; returns the first step."""
        cfg = self.cfg
        self.run_id = outputs.run_id(cfg, self.grid)      # refuses a --save into another run's directory
        if cfg.resume:
            done = checkpoint.load_checkpoint(self.trainer, cfg.resume)
            if done is not None:
                self._print(f"resumed from {checkpoint.latest_checkpoint(cfg.resume)} after step {done}")
                return done
            self._print(f"no checkpoint in {cfg.resume} yet: starting from step 0")
        if cfg.init_from:
            init_from(self.trainer, cfg.init_from)
        return 0

    def save(self, completed, rotate=True):
        """A checkpoint after ``completed`` steps; ``rotate`` False (the stop paths) deletes no older one."""
        directory = outputs.checkpoint_dir(self.cfg)
        if directory:
            self.watch.enter("checkpoint")
            path = checkpoint.save_checkpoint(self.trainer, directory, completed, self.cfg.keep if rotate else 0,
                                              self.run_id)
            self._print(f"checkpoint: {path}")

    def _stop_handler(self):
        """SIGTERM / SIGUSR1 (Slurm's --signal) only set a flag: the step in progress finishes, every
        rank agrees in the step's all-reduce, and the loop saves and exits with EXIT_PREEMPTED."""
        self.stop_requested = False

        def handler(signum, frame):
            self.stop_requested = True
        for sig in STOP_SIGNALS:
            signal.signal(sig, handler)

    def run(self):
        """The run: its outputs probed and its checkpoint directory locked first (outputs.py); with
        --on-failure shrink, begun again from the step a failure interrupted (recovery.py)."""
        held = outputs.claim(self.cfg, self.grid)
        try:
            return self._recovering()
        finally:
            outputs.release(held)

    def _recovering(self):
        start_step = self.start()
        while True:
            try:
                return self._run_from(start_step)
            except Exception as err:            # noqa: BLE001 - a failure MPI reports, with --on-failure shrink
                if self.recovery is None or not self.recovery.handles(err):
                    raise
                start_step = self.recovery.recover(err)
                if start_step is None:          # a survivor the new layout leaves idle
                    return 0

    def _run_from(self, start_step):
        cfg, t = self.cfg, self.trainer
        self._stop_handler()
        self.watch = Watchdog(self)
        self.watch.open(start_step)                 # the GEMM measurement below is watched too
        if self.peak is None:
            self.peak = self.measure_gemm_rate()
        peak = self.peak
        for c in self.trainer.communicators():
            c.stats.reset()
        self.observers = [self.watch, Tracing(self), Profiling(self), Fp8Report(self), Evaluation(self),
                          Metrics(self), Progress(self)]
        if self.recovery is not None:
            self.recovery.started(start_step)
            self.observers += [self.recovery.copies] if self.recovery.copies else []
        for o in self.observers[1:]:
            o.open(start_step)
        status, skips = 0, 0             # skips: steps skipped in a row for a non-finite loss or gradient
        try:
            for step in range(start_step, cfg.steps):
                with contextlib.ExitStack() as around:
                    for o in self.observers:
                        around.enter_context(o.step(step))
                    t0 = time.perf_counter()
                    scale = t.scaler.scale                 # the loss scale this step runs with (fp16)
                    loss, norm, lr, skipped, stop = t.step(step, self.stop_requested)
                    seconds = time.perf_counter() - t0
                self.history.append((step, loss, norm, lr, seconds))
                if step > start_step:          # the first step pays for start-up: keep it out of the figures
                    self.timelines.append(t.engine.timeline)
                    g = self.grid
                    # one pipeline per (tp, cp, dp): its dp x cp rank tells the (cp, dp) pairs apart
                    self.windows.append((g.tp_rank, g.dp_cp_comm.rank, step) + engine_window(t.engine))
                record = {"step": step, "loss": loss, "lr": lr, "grad_norm": norm,
                          "tokens_per_s": t.tokens_per_step / seconds, "step_time_s": seconds, "skipped": skipped}
                if t.scaler.dynamic:
                    record["loss_scale"] = scale
                if t.qk_clip is not None:               # each layer's heads' largest logits (qk_clip.py)
                    record["qk_max"] = t.qk_clip.last.tolist()
                if t.mtp_loss is not None:              # the MTP modules' lambda-weighted mean (nn/mtp.py)
                    record["mtp_loss"] = t.mtp_loss
                if self.recovery is not None:           # this rank's state has completed the step
                    self.recovery.after_step(step, record)
                if t.experts is not None:               # the routing of this step (expert_load.py)
                    record["experts"] = {k: v for k, v in t.experts.items() if k != "collapsed_layer"}
                    warning = t.expert_load.warning(t.experts, step)
                    if warning:
                        self._print(warning, err=True)
                for o in self.observers:
                    o.after_step(step, record)
                skips = skips + 1 if skipped and not grads_overflowed(t.scaler, loss, norm) else 0
                if skips and (cfg.nonfinite == "stop" or skips >= cfg.skip_limit):
                    good = step + 1 - skips                # the step whose weights these are (skips change none)
                    why = f"at step {step + 1}" if cfg.nonfinite == "stop" else \
                        f"in {skips} steps in a row ({good + 1} to {step + 1}; --skip-limit {cfg.skip_limit})"
                    self._print(f"hpcpar: non-finite loss or gradient {why}: stopping (the weights are those of "
                                f"step {good})", err=True)
                    self.save(good, rotate=False)
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
                if self.history and self.history[-1][0] == cfg.steps - 1:    # (not a finished run resumed)
                    self.save(cfg.steps)
                if cfg.export:
                    export(t, cfg.export, tokenizer_of(cfg.data))
        finally:
            for o in self.observers:
                o.close()
        for o in self.observers:
            o.report()
        self.summary(peak)
        self.watch.done()
        return status

    def evaluate(self, step):
        """Collective: the validation loss after ``step`` every --eval-every steps and at the end, else None."""
        every = self.cfg.eval_every
        if every and ((step + 1) % every == 0 or step == self.cfg.steps - 1):
            return self.trainer.evaluate(self.cfg.eval_batches)
        return None

    def _print(self, text, err=False):
        """Rank 0 speaks for the job."""
        if self.root:
            print(text, file=sys.stderr if err else self.out, flush=True)

    def summary(self, peak):
        """Gather the figures of every rank and print them on rank 0 (summary.py)."""
        figures = summarize(self, peak)
        if figures is not None:
            self.figures = figures
