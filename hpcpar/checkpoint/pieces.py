"""Between a Trainer's flat buffers and per-tensor pieces.

What a rank saves: the parameters it holds, once per model - rank 0 of the DP x CP group only (replicas
and context-parallel ranks hold identical parameters; an expert's: rank 0 of its expert-data-parallel
group, ``Trainer.replica_comm``, so each ep rank's experts are written once), TP rank 0 only for a
parameter TP does not cut, never the last stage's copy of a tied embedding - and, for
each, the optimizer state of the same numbers (AdamW's two moments, SGD's momentum; Muon's momentum for
a matrix it orthogonalises, AdamW's moments for the rest: ``optimizer.holds``).  With ZeRO the
optimizer state (ZeRO-3: the parameters too) is spread over the DP x CP group, so it is gathered first.

What a rank loads: for every parameter it holds, the full tensor (assembled by the reader from
whatever layout wrote it), cut to its own shard; the optimizer state likewise, then laid back into
its flat buffers (and cut to its ZeRO slice).
"""
import numpy as np

from hpcpar import backend
from hpcpar.checkpoint.files import CheckpointError


def writes(trainer, p):
    tp_cut = p.shard is not None and not p.expert            # an expert's shard is its ep cut, whole over TP
    return trainer.replica_comm(p).rank == 0 and not p.tied_copy and (tp_cut or trainer.grid.tp_rank == 0)


def _whole_state(trainer, i):
    """{state name: array over the whole flat buffer i} (gathered over its group under ZeRO), or None."""
    state = trainer.optimizer.flat_state(i)
    if state is None:
        return None
    return {name: trainer.dp.whole(i, owned) for name, owned in state.items()}


def rank_tensors(trainer, optimizer=True, every=False):
    """Collective over DP. -> (tensors {key: host array}, layout {name: (shard, full_shape)}) of this rank;
    the optimizer state too unless ``optimizer`` is False (weights alone need no gather of it).  ``every``:
    every tensor this rank holds, not only those it writes (a replica's too: what survivors of a failure
    hold in memory, training/recovery.py)."""
    tensors, layout = {}, {}
    dp = trainer.dp
    for i, flat in enumerate(dp.flats):
        state = _whole_state(trainer, i) if optimizer else None
        master = backend.to_numpy(dp.master(i))                # (ZeRO-3: gathered)
        for p, a, b in flat.segments:
            if p.tied_copy or not (every or writes(trainer, p)):
                continue
            tensors[p.name] = master[a:b].reshape(p.data.shape).copy()
            layout[p.name] = (p.shard, p.full_shape)
            for name, arr in (state or {}).items():
                if trainer.optimizer.holds(p, name):          # (Muon: a matrix's momentum, AdamW's moments else)
                    tensors[f"optimizer/{name}/{p.name}"] = backend.to_numpy(arr[a:b]).reshape(p.data.shape).copy()
    return tensors, layout


def _local(p, full):
    return p.shard.take(full) if p.shard is not None else full


def apply(trainer, read_full, state_names):
    """Load every parameter (and, if ``state_names``, its optimizer state) from full tensors.
    ``read_full(key)`` returns the full host array of a saved tensor key."""
    xp, dp, opt = trainer.xp, trainer.dp, trainer.optimizer
    for p in trainer.parameters():
        full = read_full(p.name)
        if tuple(full.shape) != p.full_shape:
            raise CheckpointError(f"{p.name} has shape {tuple(full.shape)} in the checkpoint but "
                                  f"{p.full_shape} in this model")
    for i, flat in enumerate(dp.flats):
        dp.load(i, xp.asarray(_flat(flat, lambda p: read_full(p.name), dp.dtype)))
    if not state_names:
        opt.clear_state()
        return
    for i, flat in enumerate(dp.flats):
        lo, hi = dp.owned_range(i)
        read = lambda n: lambda p: read_full(f"optimizer/{n}/{p.name}") if opt.holds(p, n) else \
            np.zeros(p.full_shape, dp.dtype)            # noqa: E731 (a state the parameter has not: zero)
        opt.load_flat_state(i, {n: xp.asarray(_flat(flat, read(n), dp.dtype)[lo:hi]) for n in state_names})


def _flat(flat, read, dtype):
    """Flat buffer ``flat``'s whole host array of the tensors ``read(p)`` returns, cut to this rank's shards."""
    whole = np.zeros(flat.size, dtype=dtype)
    for p, a, b in flat.segments:
        whole[a:b] = _local(p, read(p)).reshape(-1)
    return whole
