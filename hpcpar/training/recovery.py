"""--on-failure shrink: when ranks die, the survivors go on training in the same job, exactly.

The loop (loop.py) runs its steps; when MPI reports a failure in any call, every survivor lands here:

 1. revoke every communicator it holds (comm/ulfm.py): the ranks still waiting elsewhere wake and come too
 2. shrink the world to the survivors; their launch ranks and hosts, and how far each had got
 3. finish the interrupted step where it can: a survivor the world's all-reduce of step k let through has
    applied it; one it stopped holds its final gradients and applies step k with the survivor's totals
 4. the planner's layout for the survivors (tools/plan/survivors.py, the rule of jobs/resilient.sbatch);
    survivors no layout uses wait, idle, for the job to end
 5. a Trainer for that layout on the shrunken world: every communicator of the grid made anew by
    comm/grid.py, the model built for its shard
 6. the state, from the newest of: the survivors' own memory (ZeRO 0: a data-parallel replica of every
    lost shard survived - nothing is lost), the buddies' copies (--buddy-every), the last checkpoint,
    the initialisation; from memory the pieces travel rank to rank (checkpoint/inventory.py says who
    sends whom what, checkpoint/memory.py sends), and each rank cuts its shard as a resume would
 7. agree (MPI_Comm_agree): all survivors went through, or all start over from 2 (a second failure)

and the loop goes on from the step the state belongs to.  The data of every step is a function of the
step and the sample ids, not of the layout, so the steps it replays (from a copy or a checkpoint) are the
same steps, and the continued losses are those of a run resumed at the new layout from that state.
"""
import contextlib
import json
import os
import socket
import time
from collections import Counter
from dataclasses import replace

from hpcpar import faults
from hpcpar.comm import ulfm
from hpcpar.data_parallel.zero_memory import check_budget
from hpcpar.runtime import UsageError
from hpcpar.training import restore
from hpcpar.training.config import check_options
from hpcpar.training.models import kind_of, model_config
from hpcpar.training.step import Trainer
from hpcpar.watch import alarm
from hpcpar.watch.watchdog import flight_dir


def refuse():
    """Before any collective: one line when this MPI cannot go on after a rank dies."""
    reason = ulfm.refusal()
    if reason:
        raise UsageError(reason)


def layout_config(cfg, tp, pp, dp, mcfg):
    """The run's options on a tp x pp x dp grid, with hpcpar train's own defaults for what follows from
    the grid (micro-batches, chunks), checked; raises UsageError when the model (``mcfg``) cannot run on
    it, or would hold more than --memory-budget there."""
    new = replace(cfg, tp=tp, pp=pp, dp=dp, cp=1, ep=1, microbatches=0, chunks=0, init_from="",
                  sequence_parallel=cfg.sequence_parallel and tp > 1,
                  zero=cfg.zero if dp > 1 or cfg.zero < 2 else 0,
                  partition=cfg.partition if cfg.partition in ("uniform", "params", "flops") else "uniform")
    try:
        checked = check_options(replace(new), tp * pp * dp)
    except UsageError:               # the schedule may need a longer pipeline: hpcpar train's default then
        checked = check_options(replace(new, schedule="1f1b"), tp * pp * dp)
    model_config(checked)            # the data and the files are the run's, checked when it started
    check_budget(checked, mcfg)
    return checked


class Recovery:
    def __init__(self, loop, relayout):
        from mpi4py import MPI
        self.loop, self.relayout = loop, relayout
        world = loop.trainer.grid.world_comm.mpi
        self.world = world
        self.origin = world.allgather(MPI.COMM_WORLD.rank)      # the launch rank of each rank of the world
        self.hosts = world.allgather(socket.gethostname())
        self.done = 0                # steps this rank's live state has completed
        self.records = []            # one per recovery: who died, when, the new layout, steps replayed
        self.graveyard = []          # the old trainers: MPI may still write into the buffers of requests
        #                              posted on the revoked communicators, so they stay alive
        self.copies = restore.Copies(self) if loop.cfg.buddy_every else None
        self.pending = None          # the record of the recovery whose first new step is still to come
        self.spare, self.rebuilt, self.record = False, None, None     # the attempt under way (_rebuild)
        self.marks = {}              # when it reached each phase (time.time()), for the record

    # --- the loop's side ---------------------------------------------------------------------------

    def handles(self, err):
        return ulfm.is_failure(err)

    def started(self, step):
        self.done = step

    def after_step(self, step, record):
        """The step went through on this rank: note it, and put the recovery into its metrics record."""
        self.done = step + 1
        if self.pending is not None:
            rec, self.pending = self.pending, None
            rec["seconds_to_first_step"] = round(time.time() - rec["failed_at"], 3)
            record["recovered"] = rec
            self.loop._print(f"hpcpar: first new step {rec['seconds_to_first_step']:.2f} s after the failure "
                             f"(detected after {rec['seconds_to_detect']:.2f} s)", err=True)

    # --- a failure ---------------------------------------------------------------------------------

    def recover(self, err):
        """Collective over the survivors: rebuild the job after ``err`` (an MPI error); returns the step to
        go on from, or None on a survivor no layout uses (it leaves the loop)."""
        loop, old = self.loop, self.loop.trainer
        detected = time.time()
        with contextlib.suppress(AttributeError):       # (a failure before the watchdog started)
            loop.watch.done()                           # the watchdog must not end the job meanwhile
        ulfm.revoke([c.mpi for c in old.communicators()] + [old.grid.world_comm.mpi, self.world])
        self.graveyard.append(old)
        where = {o: r for r, o in enumerate(self.origin)}     # launch rank -> rank of the old grid
        dead = []
        while True:
            made = []                                   # what this attempt creates: revoked if it fails
            try:
                self.marks = {"revoked": time.time()}
                new, lost = ulfm.shrink(self.world)
                self.marks["shrunk"] = time.time()
                made.append(new)
                if not lost and not dead:
                    raise err                           # nobody is gone: a plain MPI error
                gone = [self.origin[r] for r in lost]
                dead += [(launch, where[launch]) for launch in gone]
                if gone and new.rank == 0:      # a rank MPI counts as dead may still run (a stall): end it
                    alarm.exclude(flight_dir(old.cfg), gone)
                self.origin = [o for r, o in enumerate(self.origin) if r not in lost]
                self.hosts = [h for r, h in enumerate(self.hosts) if r not in lost]
                self.world = new
                step = self._rebuild(old, new, made, dead, detected)
                self.record["error"] = str(err).splitlines()[0] if str(err) else type(err).__name__
                ulfm.agree(new)
                self.marks["agreed"] = time.time()
                break
            except Exception as again:                  # noqa: BLE001 - only MPI's are retried
                if not ulfm.is_failure(again):
                    raise
                ulfm.revoke(made)
        self._commit(step)
        return None if self.spare else step

    def _rebuild(self, old, new, made, dead, detected):
        loop, cfg = self.loop, old.cfg
        # 3: how far each survivor got; finish the interrupted step where a survivor has its totals
        got = new.allgather((self.done, old.reducing, old.totals))
        done = max(d for d, _, _ in got)
        totals = next((t[1] for _, _, t in got if t is not None and t[0] == done - 1), None)
        if self.done == done - 1 and old.reducing == done - 1 and totals is not None:
            result = old.apply(done - 1, totals, old.dp.slices())
            old.totals = (done - 1, totals)
            loop.history.append((done - 1, result.loss, result.grad_norm, result.lr, float("nan")))
            self.done = done
        live = cfg.zero == 0 and all(d == done or (d == done - 1 and r == d and totals is not None)
                                     for d, r, _ in got)
        # 4, 5: the layout, and the trainer on the survivors it uses
        per_node = max(Counter(self.hosts).values())
        pick = self.relayout(old.mcfg, new.size, per_node, cfg)
        if pick is None:
            restore.save_and_end(old, new, done if live else None, self.copies, loop.run_id)
        ranks, newcfg = pick
        from mpi4py import MPI
        job = new.Split(0 if new.rank < ranks else MPI.UNDEFINED, new.rank)
        self.spare = job == MPI.COMM_NULL
        trainer = None if self.spare else Trainer(newcfg, job)
        if trainer is not None:
            made += [job] + [c.mpi for c in trainer.communicators()]
        # 6: the newest state the survivors can rebuild
        needs = sorted(p.name for p in trainer.parameters()) if trainer else []
        self.marks["built"] = time.time()
        everyone = new.allgather(restore.status(old, live, self.copies, needs))
        source, step = restore.choose(everyone, done if live else None, cfg.save or cfg.resume)
        faults.check_death("recover")
        restore.rebuild(new, trainer, everyone, source, step, old, self.copies)
        self.rebuilt = (trainer, job, ranks)
        self.marks["restored"] = time.time()
        died = _death_time(loop, [r for _, r in dead]) or detected
        self.record = {"dead": [r for _, r in dead], "launch_ranks": [launch for launch, _ in dead], "step": done,
                       "ranks": [f"rank {r} ({old.grid.coord(r).words()})" for _, r in dead],
                       "failed_at": died, "seconds_to_detect": round(detected - died, 3), "source": source,
                       "from_step": step, "replayed": done - step,
                       "layout": {"tp": newcfg.tp, "pp": newcfg.pp, "dp": newcfg.dp, "world": ranks},
                       "idle": new.size - ranks}
        return step

    def _commit(self, step):
        """Every survivor agreed: the loop goes on with the new trainer from ``step``."""
        loop, rec = self.loop, self.record
        if self.spare:
            return
        t, job, ranks = self.rebuilt
        self.world, self.origin, self.hosts = job, self.origin[:ranks], self.hosts[:ranks]
        loop.trainer, loop.cfg, loop.grid = t, t.cfg, t.grid
        loop.root = t.grid.rank_id == 0
        loop.history = [h for h in loop.history if h[0] < step]
        loop.timelines, loop.windows = [], []
        loop.peak = loop.peak and loop.peak * ranks / self.graveyard[-1].grid.world     # per rank as measured
        if self.copies is not None:
            self.copies.reset(t)
        if loop.root and loop.cfg.metrics:
            _trim_metrics(loop.cfg.metrics, step)
        m, names = self.marks, ("revoked", "shrunk", "built", "restored", "agreed")
        rec["seconds"] = {"detect": rec["seconds_to_detect"], "revoke": round(m["revoked"] - rec["failed_at"], 3)}
        rec["seconds"].update((b, round(m[b] - m[a], 3)) for a, b in zip(names, names[1:]))
        self.records.append(rec)
        self.pending = rec
        lay = rec["layout"]
        survivors = lay["world"] + rec["idle"]
        loop._print(f"hpcpar: {', '.join(rec['ranks'])} gone after {_steps(rec['step'])}; "
                    + (f"{lay['world']} of the {survivors} survivors go on" if rec["idle"] else
                       f"the {survivors} survivors go on")
                    + f" as tp {lay['tp']} x pp {lay['pp']} x dp {lay['dp']} from {_said(rec['source'], step)}, "
                    f"at step {step + 1} ({_steps(rec['replayed'])} replayed)", err=True)


def _death_time(loop, ranks):
    """When the first of ``ranks`` (of the old grid) died, as its guard wrote in its flight record (None:
    no record - a rank the failure detector found, or a stall)."""
    times = []
    for r in ranks:
        with contextlib.suppress(OSError, ValueError, KeyError):      # none yet, or half written
            with open(os.path.join(flight_dir(loop.cfg), f"rank-{r}.json")) as f:
                record = json.load(f)
            if record.get("dead"):
                times.append(record["time"])
    return min(times, default=None)


def _steps(n):
    return f"{n} step{'' if n == 1 else 's'}"


def _said(source, step):
    return {"memory": "the replicas' memory", "copies": f"the buddies' copies of step {step}",
            "checkpoint": f"the checkpoint of step {step}", "start": "the initial weights"}[source]


def _trim_metrics(path, step):
    """Keep the metrics of the steps before ``step``, each once: a replayed step writes its line anew."""
    kept = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    if json.loads(line)["step"] < step:
                        kept.append(line if line.endswith("\n") else line + "\n")
                except (ValueError, KeyError):      # a line the dead rank 0 left half-written
                    continue
    except FileNotFoundError:
        return
    with open(path, "w") as f:
        f.writelines(kept)


def relayout_with(choose):
    """The recovery's layout rule from the planner's ``choose`` (tools/plan/survivors.py): (ranks, config) or None."""
    def relayout(mcfg, survivors, per_node, cfg):
        def accept(tp, pp, dp):
            try:
                layout_config(cfg, tp, pp, dp, mcfg)
                return True
            except UsageError:
                return False
        shape = kind_of(cfg).shape(mcfg)
        seq = getattr(mcfg, "seq_len", 1)
        pick = choose(shape, survivors, per_node, cfg.batch_size, seq, accept)
        return None if pick is None else (pick[0], layout_config(cfg, *pick[1], mcfg))
    return relayout

