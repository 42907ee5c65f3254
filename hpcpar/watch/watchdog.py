"""The watchdog: a thread on every rank that ends the job when the rank stops making progress.

MPI cannot cancel a blocked collective: a rank inside ``MPI_Allreduce`` whose partner never arrives
stays there, spinning, for as long as the partner is gone - and Python cannot interrupt it either
(signal handlers run only between bytecodes of the main thread).  But mpi4py releases the interpreter
lock inside every blocking MPI call, so a second thread keeps running.  The watchdog is that thread:

* the flight recorder (hpcpar/comm/flight.py) notes a heartbeat at every communication call, every
  pipeline action and every step;
* twice a second the thread compares the heartbeat with the deadline: ``--hang-timeout`` seconds, or
  three times the slowest step seen so far when that is longer (a big model's slow step is not a hang);
* when the deadline passes it writes this rank's flight record, raises the alarm (hpcpar/watch/alarm.py) so
  that every other rank writes its own, prints the diagnosis and calls ``MPI_Abort`` from the thread -
  which ends every process of the job, the stopped one included (the launcher kills them);
* a stop signal (SIGTERM, SIGUSR1) reaches the thread at once through ``signal.set_wakeup_fd``, even
  while the main thread is blocked: from then on the job has ``--shutdown-timeout`` seconds to save
  its checkpoint and exit, or the thread ends it the same way.  Exit status 3 when the checkpoint was
  written (requeue and resume), 1 otherwise; the previous complete checkpoint stays valid either way.

The thread cannot die: every file it writes (its record, the alarm) is guarded - a run directory that
cannot be written costs the diagnosis, never the ending - and anything else that goes wrong in it is
said in one line and ends the job, since a job whose watchdog is gone would hang for ever.

With ``--on-failure shrink`` a hang need not end the job: the leader names the silent ranks (the flight
records, why.culprits) and has their guards kill them (alarm.exclude), and the survivors go on without
them as after any death (training/recovery.py).  Only a hang with nobody silent - a deadlock - still
ends the job.
"""
import os
import select
import shutil
import signal
import sys
import threading
import time

from hpcpar import runtime
from hpcpar.watch import alarm
from hpcpar.comm import flight
from hpcpar.comm import placement
from hpcpar.watch import rank_guard, why

POLL_S = 0.5              # how often the thread looks at the heartbeat, the signals and the alarm
STEP_FACTOR = 3           # the deadline is at least this many times the slowest step
RESPONDER_WAIT_S = 15.0   # a rank that answered an alarm ends the job itself if the leader did not


def flight_dir(cfg):
    """<run dir>/flight: the run dir is the checkpoint directory, else the current directory."""
    return os.path.join(cfg.save or cfg.resume or ".", "flight")


class Watchdog:
    def __init__(self, rank, world, coords, layout, directory, hang_timeout, shutdown_timeout, stop_signals,
                 origin=None):
        self.rank, self.world, self.coords, self.layout = rank, world, coords, layout
        self.origin = origin          # --on-failure shrink: the launch rank of each rank (None: end the job)
        self.directory, self.stop_signals = directory, tuple(stop_signals)
        self.hang_timeout, self.shutdown_timeout = hang_timeout, shutdown_timeout
        self.recorder = flight.FlightRecorder(rank)
        self.slowest = 0.0            # seconds of the slowest step after the first
        self.stop_at = None           # time.monotonic() of the first stop signal
        self.preempt_saved = False    # the checkpoint after the stop signal is complete
        self._firing = threading.Lock()     # held by the one path that ends the job
        self._answered = None
        self._done = threading.Event()

    # --- the main thread's side ------------------------------------------------------------------

    def start(self, grid):
        """Install the recorder, learn the groups' members, listen for signals, start the thread."""
        rec = flight.install(self.recorder)
        for c in grid.communicators():
            rec.groups[c.name] = placement.world_ranks(c.mpi, grid.world_comm.mpi)
        rec.mirror = rank_guard.page()
        if rec.mirror is not None:
            rec.mirror.set_coords(self.rank, self.world, self.coords)
        if self.rank == 0:
            try:
                if os.path.isdir(self.directory):                 # the last run's records: keep one copy
                    shutil.rmtree(self.directory + ".previous", ignore_errors=True)
                    os.replace(self.directory, self.directory + ".previous")
                os.makedirs(self.directory)                        # can it be made? (made again when needed)
                os.rmdir(self.directory)
            except OSError as err:
                self._say(f"warning: flight records cannot be written in {self.directory} "
                          f"({err.strerror or err}): a hang still ends the job, without the diagnosis")
        grid.world_comm.mpi.Barrier()                              # no rank writes before that
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        self._old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self._wake_w = wake_w
        runtime.on_fault(self.on_fault)
        self._thread = threading.Thread(target=self._run, name="hpcpar-watchdog", daemon=True)
        self._thread.start()
        return self

    def new_step(self, step):
        self.recorder.new_step(step)

    def step_done(self, index, seconds):
        if index > 0:                                  # the first step pays for start-up
            self.slowest = max(self.slowest, seconds)

    def enter(self, phase):
        self.recorder.enter(phase)

    def checkpoint_after_stop(self):
        self.preempt_saved = True

    def stop(self):
        self._done.set()
        self._thread.join(timeout=2 * POLL_S)
        signal.set_wakeup_fd(self._old_wakeup)
        os.close(self._wake_r)
        os.close(self._wake_w)
        runtime.remove_fault_hook(self.on_fault)
        flight.uninstall()

    def on_fault(self, err):
        """An exception is about to end the job (runtime.run_guarded): leave this rank's record. An MPI
        error is often the echo of a rank that died: if its guard raised the alarm, let it finish."""
        self._write(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        from mpi4py import MPI
        if not isinstance(err, MPI.Exception):
            return
        give_up = time.monotonic() + 1.0
        while time.monotonic() < give_up:
            if alarm.raised(self.directory):
                time.sleep(RESPONDER_WAIT_S)           # the leader ends the job meanwhile
            time.sleep(0.1)

    # --- the thread ------------------------------------------------------------------------------

    def deadline(self):
        return max(self.hang_timeout, STEP_FACTOR * self.slowest)

    def _run(self):
        try:
            self._watch()
        except BaseException as err:          # noqa: BLE001 - a dead watchdog would leave a hang unended
            self._say(f"rank {self.rank}: the watchdog failed ({type(err).__name__}: {err}); ending the job")
            self._end()

    def _watch(self):
        while not self._done.is_set():
            if select.select([self._wake_r], [], [], POLL_S)[0]:
                got = os.read(self._wake_r, 64)
                if self.stop_at is None and any(s in got for s in self.stop_signals):
                    self.stop_at = time.monotonic()
            if self._done.is_set():
                return
            now = time.monotonic()
            idle = now - self.recorder.beat
            if self.hang_timeout and idle > self.deadline():
                self._fire(f"no progress for {idle:.1f} s (hang timeout {self.deadline():g} s)")
            elif self.stop_at is not None and self.shutdown_timeout and now - self.stop_at > self.shutdown_timeout:
                saved = "written" if self.preempt_saved else "not written"
                self._fire(f"a stop signal came {now - self.stop_at:.1f} s ago and the job did not end within "
                           f"the shutdown timeout of {self.shutdown_timeout:g} s (its checkpoint: {saved})")
            elif self._answered is None and idle > POLL_S and alarm.raised(self.directory):
                self._answered = now
                self._write(None)
            elif self._answered is not None and now - self._answered > RESPONDER_WAIT_S and self.origin is None:
                self._end()

    def _say(self, line):
        try:
            print(f"hpcpar: {line}", file=sys.stderr, flush=True)
        except (OSError, ValueError):                 # stderr gone: the job still ends
            pass

    def _write(self, reason):
        extra = {"coords": self.coords.as_dict(), "layout": self.layout}
        try:
            flight.write_record(self.directory, self.recorder.snapshot(reason, extra))
        except OSError as err:
            self._say(f"rank {self.rank}: cannot write its flight record in {self.directory}: "
                      f"{err.strerror or err}")

    def _fire(self, reason):
        if not self._firing.acquire(blocking=False):
            return
        self._write(reason)
        c = self.coords
        shrink = self.origin is not None and self.stop_at is None
        try:
            leader = alarm.claim(self.directory, f"rank {self.rank}")
        except OSError as err:                        # no alarm: the others' watchdogs end it too, later
            leader = None
            self._say(f"rank {self.rank} ({c.words()}): {reason}; cannot raise the alarm in {self.directory} "
                      f"({err.strerror or err}): ending the job without the other ranks' records")
        if leader:
            self._say(f"rank {self.rank} ({c.words()}): {reason}; "
                      + ("the others go on without the silent ranks" if shrink else "ending the job"))
            alarm.announce(self.directory, self.world)
            if shrink and self._exclude():
                return                                # their deaths reach the survivors as any other
        elif leader is not None:
            if shrink:
                return                                # the leader excludes the silent ranks
            time.sleep(RESPONDER_WAIT_S)              # the leader ends the job; this is the fallback
        self._end()

    def _exclude(self):
        """--on-failure shrink: order the guards of the silent ranks to kill them; False if none is."""
        try:
            silent = [r for r in why.culprits(flight.read_records(self.directory), self.world)
                      if r != self.rank and not os.path.exists(os.path.join(self.directory, f"rank-{r}.json"))]
        except (OSError, ValueError):
            return False
        if silent:
            alarm.exclude(self.directory, [self.origin[r] for r in silent])
        return bool(silent)

    def _end(self):
        if self._done.is_set():                       # stopped meanwhile (a recovery under way): not ours to end
            return
        code = runtime.EXIT_PREEMPTED if self.preempt_saved else runtime.EXIT_FAILURE
        sys.stdout.flush()
        sys.stderr.flush()
        threading.Timer(5.0, os._exit, (code,)).start()     # should MPI_Abort itself hang
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(code)
        os._exit(code)


class Off:
    """What the loop holds when both timeouts are 0: nothing watches, nothing is recorded."""

    def new_step(self, step):
        pass

    def step_done(self, index, seconds):
        pass

    def enter(self, phase):
        pass

    def checkpoint_after_stop(self):
        pass

    def stop(self):
        pass


def start(cfg, grid, stop_signals, origin=None):
    """The watchdog of this rank, running (``Off`` when both timeouts are 0).  ``origin``: the launch rank
    of each rank, for a job that goes on without a rank that hangs (--on-failure shrink)."""
    if not (cfg.hang_timeout or cfg.shutdown_timeout):
        return Off()
    layout = {"tp": grid.tp, "cp": grid.cp, "pp": grid.pp, "dp": grid.dp, "world": grid.world,
              "order": "-".join(grid.order)}
    dog = Watchdog(grid.rank_id, grid.world, grid.coords, layout, flight_dir(cfg), cfg.hang_timeout,
                   cfg.shutdown_timeout, [int(s) for s in stop_signals], origin)
    return dog.start(grid)
