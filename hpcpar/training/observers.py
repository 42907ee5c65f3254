"""What watches the training loop (loop.py): one ``Observer`` subclass each, in ``Loop.observers``.

An observer sees the loop through five hooks - before the first step, around each step, after each
step (with the step's record, to which it may add), when the loop ends however it ends, and after it
before the summary - and does nothing where it has nothing to do.  The watchdog, the tracer, the
profiler, the FP8 figures, the evaluation on validation data, the metrics file and the progress bar are
here; the recovery's copies on another node beside their subject (restore.Copies).
"""
import contextlib
import json
import signal
import sys

from hpcpar import tracer as trace
from hpcpar.fp8 import stats
from hpcpar.runtime import RunFault
from hpcpar.training.profiler import Profiler, report as profile_report
from hpcpar.watch import watchdog

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Observer:
    """Watches the step loop; every hook does nothing unless a subclass says otherwise.  Hooks run in
    the order of ``Loop.observers``, on every rank (a hook that only rank 0 needs checks loop.root)."""

    def __init__(self, loop):
        self.loop, self.cfg = loop, loop.cfg

    def open(self, first_step):
        """Before the first step (collective where the observer's start is)."""

    def step(self, step):
        """A context around one step's computation (its time is the step's time)."""
        return contextlib.nullcontext()

    def after_step(self, step, record):
        """After each step; ``record`` holds the step's figures (an observer may add its own)."""

    def close(self):
        """When the loop ends, however it ends."""

    def report(self):
        """After the loop, before the summary (collective where the report gathers)."""


class Watchdog(Observer):
    """Hangs and the shutdown deadline (watchdog.py): told of every step, and of the phases after them."""

    def open(self, first_step):
        self.first = first_step
        recovery = self.loop.recovery
        self.dog = watchdog.start(self.cfg, self.loop.grid, STOP_SIGNALS, recovery and recovery.origin)

    @contextlib.contextmanager
    def step(self, step):
        self.dog.new_step(step)
        yield

    def after_step(self, step, record):
        self.dog.step_done(step - self.first, record["step_time_s"])

    def enter(self, phase):
        self.dog.enter(phase)

    def checkpoint_after_stop(self):
        self.dog.checkpoint_after_stop()

    def report(self):
        self.dog.enter("summary")

    def done(self):
        self.dog.stop()


class Tracing(Observer):
    """--trace: a Chrome/Perfetto trace of --trace-steps steps from the second one on (the first pays for
    start-up), written by rank 0 at the end."""

    def open(self, first_step):
        self.tracer = self._start() if self.cfg.trace else None
        self.traced = range(first_step + 1, first_step + 1 + self.cfg.trace_steps)

    def _start(self):
        cfg, g, s = self.cfg, self.loop.grid, self.loop.trainer.schedule
        from hpcpar.pipeline.csv_format import dumps
        # the order itself, not only its name: a --schedule-file run's cannot be rebuilt by name
        meta = {"schedule": s.name, "stages": s.stages, "microbatches": s.microbatches, "chunks": s.chunks,
                "split_backward": s.split_backward, "schedule_csv": dumps(s), "tp": cfg.tp, "cp": cfg.cp, "pp": cfg.pp, "dp": cfg.dp,
                "model": cfg.model, "dtype": cfg.dtype}
        return trace.start(f"rank {g.rank_id} {g.coords}", g.world_comm.mpi, meta)

    def step(self, step):
        if self.tracer:
            self.tracer.enabled = step in self.traced
        return contextlib.nullcontext()

    def after_step(self, step, record):
        if self.tracer and self.tracer.enabled:
            g = self.loop.grid
            trace.add_engine_step(self.tracer, step, self.loop.trainer.engine,
                                  f"tp{g.tp_rank}.cp{g.cp_rank}.dp{g.dp_rank}")

    def report(self):
        if self.tracer:
            trace.write(trace.stop(), self.loop.grid.world_comm.mpi, self.cfg.trace)
            self.loop._print(f"trace: {self.cfg.trace} (open in https://ui.perfetto.dev; hpcpar trace summary "
                             f"{self.cfg.trace})")


class Profiling(Observer):
    """--profile: where the steps' time went, by category; the first step measures the GEMM floor."""

    def open(self, first_step):
        self.first = first_step
        self.prof = Profiler().install(self.loop.trainer.communicators()) if self.cfg.profile else None

    def step(self, step):
        return self.prof.step(floor=step == self.first) if self.prof else contextlib.nullcontext()

    def report(self):
        if self.prof:
            self.prof.remove()
            per_rank = self.loop.grid.world_comm.mpi.gather(self.prof.per_step(), root=0)  # once: pickled is fine
            if self.loop.root:
                docs = self.loop.trainer.doc_figures
                self.loop._print(profile_report(per_rank) + ("\n" + docs.work_line() if docs else ""))


class Fp8Report(Observer):
    """FP8/FP4 (training/low_precision.py): the quantisation figures of every step, a summary line at the
    end (the table with --profile)."""

    def __init__(self, loop):
        super().__init__(loop)
        self.low = loop.trainer.low_precision
        self.seen, self.run = set(), {}

    def after_step(self, step, record):
        """Collective: every rank's figures of the step, merged on rank 0."""
        if self.low is None:
            return
        everyone = self.loop.grid.world_comm.mpi.gather(self.low.take_figures(), root=0)
        if not self.loop.root:
            return
        merged = stats.merge(everyone)
        self.run = stats.merge([self.run, merged])
        record["fp8"] = stats.metrics(merged)
        for line in stats.warnings(merged, self.seen):
            self.loop._print(line, err=True)

    def report(self):
        if self.low is None or not self.loop.root or not self.run:
            return
        self.loop._print(stats.summary_line(self.cfg.precision, self.run))
        if self.cfg.profile:
            self.loop._print(stats.table(self.cfg.precision, self.low.scalings(), self.run))


class Evaluation(Observer):
    """--eval-every: the validation loss, into the step's record (collective)."""

    def after_step(self, step, record):
        val_loss = self.loop.evaluate(step)
        if val_loss is not None:
            record["val_loss"] = val_loss


class Metrics(Observer):
    """--metrics: one JSON line per step, written by rank 0 (appended to when the run resumes)."""

    def open(self, first_step):
        self.file = open(self.cfg.metrics, "a" if first_step else "w") if (self.loop.root and self.cfg.metrics) \
            else None

    def after_step(self, step, record):
        if self.file:
            try:
                self.file.write(json.dumps(record) + "\n")
                self.file.flush()
            except OSError as err:                  # rank 0 alone: the others are in the next step
                raise RunFault(f"cannot write --metrics {self.cfg.metrics}: {err.strerror or err}") from None

    def close(self):
        if self.file:
            try:
                self.file.close()
            except OSError:                         # the write that failed said so already
                pass


class Progress(Observer):
    """Rank 0's progress bar (stderr) and a loss line every --log-every steps (about 10 per run)."""

    def open(self, first_step):
        self.log_every = self.cfg.log_every or max(1, self.cfg.steps // 10)
        self.bar = None
        if self.loop.root and self.cfg.progress:
            from tqdm import tqdm
            self.bar = tqdm(total=self.cfg.steps, initial=first_step, desc="train", unit="step", mininterval=0.5,
                            file=sys.stderr, dynamic_ncols=True)

    def after_step(self, step, record):
        if not self.loop.root:
            return
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record['loss']:.4f}")
            self.bar.update(1)
        steps, say = self.cfg.steps, self.loop._print
        if (step + 1) % self.log_every == 0 or step == steps - 1:
            mtp = f"  mtp_loss {record['mtp_loss']:.12g}" if "mtp_loss" in record else ""
            say(f"step {step + 1:>5}/{steps}  loss {record['loss']:.12g}{mtp}  grad_norm {record['grad_norm']:.4g}  "
                f"lr {record['lr']:.3g}  {record['step_time_s'] * 1e3:.1f} ms")
        if "val_loss" in record:
            say(f"step {step + 1:>5}/{steps}  val_loss {record['val_loss']:.12g}")

    def close(self):
        if self.bar is not None:
            self.bar.close()
