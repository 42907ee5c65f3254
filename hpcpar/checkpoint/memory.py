"""The model state in memory: what a rank holds of it, copies of it on a buddy, and the exchange that
hands every rank of a new layout the pieces it needs - a checkpoint that never touches the disk.

Three things survivors of a failure can rebuild from (training/recovery.py chooses):

  live_pieces   the state this rank trains with, every piece of it (parameters and optimizer state).
                Under ZeRO 0 each data-parallel replica holds all of its model-parallel shard, so when a
                replica of every lost shard survives, nothing is lost at all.
  Buddies       every --buddy-every steps, each rank's snapshot (the pieces a checkpoint would hold of
                it) goes to its buddy: the rank at the same place on the next node.  A node that dies
                takes its ranks' state with it, but not their buddies' copies.
  (the last checkpoint on disk: load.py, any layout to any layout.)

The pieces are named like a checkpoint's (inventory.py), so the same resharding applies: each rank
receives every part of the tensors it needs (``exchange``), ``MemoryReader.full`` assembles them, and
pieces.apply cuts this rank's shard out - exactly as loading a checkpoint written by the old layout.
"""
import time
from dataclasses import dataclass, field

import numpy as np

from hpcpar.checkpoint.inventory import Spec, holders
from hpcpar.checkpoint.pieces import rank_tensors
from hpcpar.checkpoint.save import write_checkpoint
from hpcpar.nn.parameter import Shard


def _pieces(tensors, layout):
    """{(key, part): (array, Spec)} of rank_tensors' output."""
    out = {}
    for key, a in tensors.items():
        shard, full = layout[key.rsplit("/", 1)[-1]]
        spec = Spec(1, None, None, tuple(a.shape), tuple(full), str(a.dtype)) if shard is None else \
            Spec(shard.parts, shard.dim, shard.groups, tuple(a.shape), tuple(full), str(a.dtype))
        out[(key, 0 if shard is None else shard.index)] = (a, spec)
    return out


def live_pieces(trainer):
    """Every piece of the state this rank trains with (ZeRO 0: no communication)."""
    return _pieces(*rank_tensors(trainer, every=True))


@dataclass
class Snapshot:
    """The state after ``step`` completed steps, as a checkpoint holds it: pieces, the optimizer's step
    count and the loss scale."""
    step: int
    t: int
    loss_scale: tuple
    pieces: dict = field(default_factory=dict)      # {(key, part): (array, Spec)}

    def specs(self):
        return {kp: spec for kp, (_, spec) in self.pieces.items()}


def snapshot(trainer, step):
    """Collective over dp x cp (ZeRO gathers the optimizer state): this rank's part of a checkpoint."""
    return Snapshot(step, trainer.optimizer.t, (trainer.scaler.scale, trainer.scaler.good_steps),
                    _pieces(*rank_tensors(trainer)))


def buddies(hosts):
    """[buddy of each rank]: the rank at the same place on the next node (cyclic), or the next rank when
    the job has one node; None for a job of one rank.  ``hosts``: the host of each rank."""
    nodes = list(dict.fromkeys(hosts))
    on = {h: [r for r, x in enumerate(hosts) if x == h] for h in nodes}
    if len(hosts) == 1:
        return [None]
    if len(nodes) == 1:
        return [(r + 1) % len(hosts) for r in range(len(hosts))]
    out = []
    for r, h in enumerate(hosts):
        nxt = on[nodes[(nodes.index(h) + 1) % len(nodes)]]
        out.append(nxt[on[h].index(r) % len(nxt)])
    return out


class Buddies:
    """This rank's snapshots and the copies it keeps of others', newest last.  A refresh keeps the
    previous generation until ``confirm`` - a world collective after the refresh has completed, so
    every rank holds its new copies - for a failure in the middle of a refresh leaves some ranks with
    the new one and some with the old (recovery takes the newest step every piece is held at)."""

    def __init__(self, comm, hosts):
        self.comm = comm                    # mpi4py communicator of the world
        self.to = buddies(hosts)
        self.own, self.kept = [], []        # [Snapshot]; [{origin rank: Snapshot}]
        self.refreshes, self.seconds, self.bytes = 0, 0.0, 0      # their cost, for the summary and the bench

    def refresh(self, trainer, step):
        """Collective: snapshot this rank's state and swap copies with the buddies."""
        start = time.perf_counter()
        mine = snapshot(trainer, step)
        self.own.append(mine)
        self.kept.append(self._swap(mine))
        self.seconds += time.perf_counter() - start
        self.refreshes += 1

    def confirm(self):
        self.own, self.kept = self.own[-1:], self.kept[-1:]

    def _swap(self, mine):
        """Send ``mine`` to this rank's buddy, receive the snapshots of the ranks whose buddy this is:
        the layout of the pieces pickled (small), their bytes as one buffer each."""
        from mpi4py import MPI
        comm, rank = self.comm, self.comm.rank
        senders = [r for r, b in enumerate(self.to) if b == rank]
        arrays = [np.ascontiguousarray(a) for a, _ in mine.pieces.values()]
        payload = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays]) if arrays else np.empty(0, np.uint8)
        header = (mine.step, mine.t, mine.loss_scale, [(kp, spec) for kp, (_, spec) in mine.pieces.items()],
                  payload.size)
        reqs = [comm.isend(header, dest=self.to[rank], tag=1)] if self.to[rank] is not None else []
        headers = {r: comm.recv(source=r, tag=1) for r in senders}
        MPI.Request.Waitall(reqs)
        bufs = {r: np.empty(h[4], np.uint8) for r, h in headers.items()}
        reqs = [comm.Irecv(bufs[r], source=r, tag=2) for r in senders]
        if self.to[rank] is not None:
            reqs.append(comm.Isend(payload, dest=self.to[rank], tag=2))
        MPI.Request.Waitall(reqs)
        self.bytes += payload.nbytes
        return {r: _unpack(headers[r], bufs[r]) for r in senders}


def _unpack(header, buf):
    step, t, loss_scale, specs, _ = header
    pieces, at = {}, 0
    for kp, spec in specs:
        n = int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize
        pieces[kp] = (buf[at:at + n].view(spec.dtype).reshape(spec.shape), spec)
        at += n
    return Snapshot(step, t, loss_scale, pieces)


def exchange(comm, plan, mine, specs):
    """Collective over ``comm``: carry out ``plan`` (inventory.transfers, the same list on every rank).
    ``mine``: {(key, part): array} this rank holds; ``specs``: the Spec of every piece in the plan.
    Returns {(key, part): array} of the pieces this rank is the destination of."""
    from mpi4py import MPI
    got, reqs = {}, []
    for tag, (src, dst, key, part) in enumerate(plan):
        kp = (key, part)
        if dst == comm.rank and src == dst:
            got[kp] = mine[kp]
        elif dst == comm.rank:
            got[kp] = np.empty(specs[kp].shape, dtype=specs[kp].dtype)
            reqs.append(comm.Irecv(got[kp], source=src, tag=tag))
        elif src == comm.rank:
            reqs.append(comm.Isend(np.ascontiguousarray(mine[kp]), dest=dst, tag=tag))
    MPI.Request.Waitall(reqs)
    return got


class MemoryReader:
    """Whole tensors from the pieces ``exchange`` delivered: the interface of load.CheckpointReader."""

    def __init__(self, got, specs):
        self.got, self.specs = got, specs

    def full(self, key):
        spec = self.specs[(key, 0)]
        parts = [self.got[(key, i)] for i in range(spec.parts)]
        if spec.dim is None:
            return parts[0]
        return Shard(spec.dim, spec.parts, 0, spec.groups).assemble(parts, spec.full_shape)


def save_pieces(meta, comm, directory, step, keep, held, mine, run=None):
    """Collective over ``comm``: a checkpoint of pieces kept in memory (when no layout of the survivors can
    take them).  ``held``: {rank: {(key, part): Spec}} of every rank; ``mine``: {(key, part): array} this
    rank's.  Each part of each parameter is written, with its optimizer state, by its lowest holder; a rank
    holding several parts of one tensor (its own and a buddy's) writes them into files of their own."""
    files = []                                   # [(tensors, layout)], the parts of one tensor in different files
    for key, part in sorted(kp for kp in held[comm.rank] if not kp[0].startswith("optimizer/")):
        if holders(held, key, part)[0] != comm.rank:
            continue
        spec = held[comm.rank][(key, part)]
        if all(key in layout for _, layout in files):
            files.append(({}, {}))
        tensors, layout = next(f for f in files if key not in f[1])
        tensors[key] = mine[(key, part)]
        tensors.update((k, a) for (k, p), a in mine.items() if p == part and k.startswith("optimizer/")
                       and k.rsplit("/", 1)[-1] == key)
        layout[key] = (None if spec.dim is None else Shard(spec.dim, spec.parts, part, spec.groups), spec.full_shape)
    names = [f"rank-{comm.rank:05d}" + (f"-{j}" if j else "") + ".safetensors" for j in range(len(files))]
    return write_checkpoint(meta, comm, directory, step, keep, dict(zip(names, files)), run)
