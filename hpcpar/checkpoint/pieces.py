"""Between a Trainer's flat buffers and per-tensor pieces.

What a rank saves: the parameters it holds, once per model - rank 0 of the DP x CP group only (replicas
and context-parallel ranks hold identical parameters),
TP rank 0 only for a replicated parameter, never the last stage's copy of a tied embedding - and, for
each, the optimizer state of the same numbers (AdamW's two moments, SGD's momentum).  With ZeRO-1 the
optimizer state is spread over the DP group, so it is gathered first.

What a rank loads: for every parameter it holds, the full tensor (assembled by the reader from
whatever layout wrote it), cut to its own shard; the optimizer state likewise, then laid back into
its flat buckets (and cut to its ZeRO-1 slice).
"""
import numpy as np

from hpcpar import backend
from hpcpar.comm import wait_all
from hpcpar.checkpoint.files import CheckpointError


def writes(trainer, p):
    g = trainer.grid
    return g.dp_cp_comm.rank == 0 and not p.tied_copy and (p.shard is not None or g.tp_rank == 0)


def _whole_bucket_state(trainer, i):
    """{state name: array over the whole bucket i} (gathered over DP x CP under ZeRO-1), or None."""
    dp, opt = trainer.dp, trainer.optimizer
    state = opt.state.get(i)
    if state is None:
        return None
    if not dp.zero1:
        return state
    out, requests = {}, []
    lo, hi = dp.buckets[i].zero_range(dp.comm.rank, dp.comm.size)
    for name, owned in state.items():
        whole = backend.array_module(owned).zeros(dp.buckets[i].size, dtype=owned.dtype)
        whole[lo:hi] = owned
        requests.append(dp.comm.iall_gather_(whole))
        out[name] = whole
    wait_all(requests)
    return out


def rank_tensors(trainer, optimizer=True):
    """Collective over DP. -> (tensors {key: host array}, layout {name: (shard, full_shape)}) of this rank;
    the optimizer state too unless ``optimizer`` is False (weights alone need no gather of it)."""
    tensors, layout = {}, {}
    for i, bucket in enumerate(trainer.dp.buckets):
        state = _whole_bucket_state(trainer, i) if optimizer else None
        for p, a, b in bucket.segments:
            if not writes(trainer, p):
                continue
            tensors[p.name] = backend.to_numpy(p.master_data()).copy()
            layout[p.name] = (p.shard, p.full_shape)
            for name, arr in (state or {}).items():
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
        p.master_data()[...] = xp.asarray(_local(p, full), dtype=p.master_data().dtype)
    for bucket in dp.buckets:
        bucket.refresh()
    if not state_names:
        opt.state.clear()
        return
    for i, bucket in enumerate(dp.buckets):
        whole = {n: np.zeros(bucket.size, dtype=bucket.data.dtype) for n in state_names}
        for p, a, b in bucket.segments:
            for n in state_names:
                whole[n][a:b] = _local(p, read_full(f"optimizer/{n}/{p.name}")).reshape(-1)
        lo, hi = bucket.zero_range(dp.comm.rank, dp.comm.size) if dp.zero1 else (0, bucket.size)
        opt.state[i] = {n: xp.asarray(whole[n][lo:hi]) for n in state_names}
