"""Where the survivors of a failure take the model state from (training/recovery.py, step 6).

Every survivor tells the others what it holds (``status``: pieces named as in a checkpoint, with how each
sits in its tensor - checkpoint/inventory.py); ``choose`` takes the newest state every piece of which
some survivor holds, in this order on a tie:

    memory      the survivors' own live state (ZeRO 0): a data-parallel replica of every lost shard lived
    copies      the buddies' snapshots (--buddy-every K, ``Copies``): a lost rank's copy is on another node
    checkpoint  the last one on disk (--save), any layout to any layout (checkpoint/load.py)
    start       the initial weights (a function of the seed, or --init-from): every step replayed

``rebuild`` hands every rank of the new layout its pieces (from memory: inventory.transfers says who
sends whom what) and cuts its shard, as a resume would.  When no layout fits the survivors at all,
``save_and_end`` writes what they hold as a checkpoint and ends the job.
"""
import sys
from types import SimpleNamespace

from hpcpar.checkpoint import latest_checkpoint, load_checkpoint
from hpcpar.checkpoint.consolidated import init_from
from hpcpar.checkpoint.files import read_json
from hpcpar.checkpoint.hf import expected_shapes
from hpcpar.checkpoint.inventory import complete, transfers
from hpcpar.checkpoint.memory import Buddies, MemoryReader, exchange, live_pieces, save_pieces
from hpcpar.checkpoint.pieces import apply
from hpcpar.comm import ulfm
from hpcpar.runtime import EXIT_FAILURE
from hpcpar.training.observers import Observer

SOURCES = ("memory", "copies", "checkpoint", "start")     # the preference on a tie of steps


def status(old, live, copies, needs):
    """What this survivor tells the others: the pieces it holds (live: its state, when that can serve),
    its copies' pieces by step, the optimizer's step count and loss scale, and the tensors it needs."""
    return {"live": {kp: spec for kp, (_, spec) in live_pieces(old).items()} if live else {},
            "copies": copies.specs() if copies else {}, "t": old.optimizer.t,
            "scale": (old.scaler.scale, old.scaler.good_steps), "needs": needs}


def choose(everyone, live_step, directory):
    """(source, step): the newest state every needed piece of which a survivor holds; SOURCES breaks ties.
    ``live_step``: the step the live states are at (None: they cannot serve)."""
    needs = {r: set(s["needs"]) for r, s in enumerate(everyone) if s["needs"]}
    options = []
    if live_step is not None:
        held = {r: s["live"] for r, s in enumerate(everyone)}
        if complete(held, with_state(needs, held)):
            options.append(("memory", live_step))
    for step in sorted({s for e in everyone for s in e["copies"]}, reverse=True):
        held = {r: e["copies"].get(step, {}) for r, e in enumerate(everyone)}
        if complete(held, with_state(needs, held)):
            options.append(("copies", step))
            break
    latest = latest_checkpoint(directory) if directory else None
    if latest is not None:
        options.append(("checkpoint", read_json(latest / "manifest.json")["step"]))
    options.append(("start", 0))
    return max(options, key=lambda o: (o[1], -SOURCES.index(o[0])))


def held(source, step, everyone, old, copies):
    """(the pieces every survivor holds, this rank's arrays, (optimizer step count, loss scale)) of a
    state in memory."""
    if source == "memory":
        return ({r: s["live"] for r, s in enumerate(everyone)},
                {kp: a for kp, (a, _) in live_pieces(old).items()}, (everyone[0]["t"], everyone[0]["scale"]))
    return {r: e["copies"].get(step, {}) for r, e in enumerate(everyone)}, copies.arrays(step), copies.meta(step)


def rebuild(comm, trainer, everyone, source, step, old, copies):
    """Collective over the survivors (``trainer`` None on one the new layout leaves idle): the new
    trainer takes the state of ``source`` at ``step``."""
    cfg = old.cfg
    if source in ("memory", "copies"):
        pieces, mine, (t, loss_scale) = held(source, step, everyone, old, copies)
        needs = with_state({r: set(s["needs"]) for r, s in enumerate(everyone) if s["needs"]}, pieces)
        specs = {kp: spec for on in pieces.values() for kp, spec in on.items()}
        got = exchange(comm, transfers(pieces, needs), mine, specs)
        if trainer is not None:
            apply(trainer, MemoryReader(got, specs).full, _states(pieces))
            trainer.optimizer.t = t
            trainer.scaler.scale, trainer.scaler.good_steps = loss_scale
    elif trainer is not None and source == "checkpoint":
        load_checkpoint(trainer, cfg.save or cfg.resume)
    elif trainer is not None and cfg.init_from:
        init_from(trainer, cfg.init_from)


def save_and_end(old, comm, live_step, copies, run=None):
    """No layout of the model fits the survivors: the newest state they hold in memory becomes a
    checkpoint (when it is newer than the last one; as run ``run``'s), and the job ends, saying where it is."""
    cfg = old.cfg
    directory = cfg.save or cfg.resume
    names = sorted(expected_shapes(old.mcfg)) if old.kind.sequences else []      # the MLP's: not a family's
    everyone = comm.allgather(status(old, live_step is not None, copies, names if comm.rank == 0 else []))
    source, step = choose(everyone, live_step, directory)
    where = f"its last checkpoint stays ({directory})" if directory else "and it saved no checkpoint (--save)"
    if source in ("memory", "copies") and directory and names:
        pieces, mine, (t, (scale, good)) = held(source, step, everyone, old, copies)
        meta = SimpleNamespace(cfg=cfg, mcfg=old.mcfg, optimizer=SimpleNamespace(t=t, state_names=old.optimizer.state_names),
                               scaler=SimpleNamespace(scale=scale, good_steps=good))
        path = save_pieces(meta, comm, directory, step, cfg.keep, pieces, mine, run)
        where = f"the state after step {step} is saved as {path}"
    ulfm.agree(comm)
    if comm.rank == 0:
        print(f"hpcpar: error: no layout of the model fits the {comm.size} surviving rank(s); {where}: resume "
              f"it on more ranks (--resume {directory or 'DIR'})", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_FAILURE)


def _states(pieces):
    """The optimizer states the pieces hold, in key order."""
    return sorted({k.split("/")[1] for on in pieces.values() for k, _ in on if k.startswith("optimizer/")})


def with_state(needs, pieces):
    """Each rank's needed keys: its parameters, and their optimizer state of every kind ``pieces`` hold."""
    states = _states(pieces)
    return {r: set(keys) | {f"optimizer/{n}/{k}" for n in states for k in keys} for r, keys in needs.items()}


class Copies(Observer):
    """--buddy-every K: every K steps each rank's snapshot goes to its buddy on another node (checkpoint/
    memory.py).  An observer of the loop (observers.py), made by the recovery before the loop."""

    def __init__(self, recovery):
        self.recovery = recovery
        self.buddies = None

    def reset(self, trainer):
        self.buddies = Buddies(trainer.grid.world_comm.mpi, self.recovery.hosts)

    def specs(self):
        """{step: {(key, part): Spec}} of every snapshot this rank holds, its own and its buddies'."""
        if self.buddies is None:
            return {}
        out = {}
        for snap in self.buddies.own:
            out.setdefault(snap.step, {}).update(snap.specs())
        for kept in self.buddies.kept:
            for snap in kept.values():
                out.setdefault(snap.step, {}).update(snap.specs())
        return out

    def arrays(self, step):
        out = {}
        for snap in self.buddies.own + [s for kept in self.buddies.kept for s in kept.values()]:
            if snap.step == step:
                out.update((kp, a) for kp, (a, _) in snap.pieces.items())
        return out

    def figures(self):
        """What the refreshes cost this rank, each on average."""
        b = self.buddies
        n = max(1, b.refreshes)
        return {"refreshes": b.refreshes, "seconds_per_refresh": b.seconds / n, "bytes_per_refresh": b.bytes / n}

    def meta(self, step):
        snap = next(s for s in self.buddies.own + [s for k in self.buddies.kept for s in k.values()]
                    if s.step == step)
        return snap.t, snap.loss_scale

    # the observer's hooks
    def open(self, first_step):
        """A snapshot of the state the loop starts from (at the start of the job, or just rebuilt)."""
        if self.buddies is None:
            self.reset(self.recovery.loop.trainer)
        if not any(s.step == first_step for s in self.buddies.own):
            self.buddies.refresh(self.recovery.loop.trainer, first_step)

    def after_step(self, step, record):
        b, every = self.buddies, self.recovery.loop.cfg.buddy_every
        b.confirm()                       # this step's all-reduce went through: every rank holds the last copies
        if (step + 1) % every == 0:
            b.refresh(self.recovery.loop.trainer, step + 1)


