"""Who sends whom which piece, when the survivors of a failure rebuild the model state from memory.

Pure arithmetic, no MPI (the sending is memory.py's).  A *piece* is what one rank holds of one saved
tensor, named as in a checkpoint: (key, part) - the key "h.0.attn.c_attn.weight" or
"optimizer/exp_avg/h.0.attn.c_attn.weight", the part the tensor-parallel cut of the old layout made
(part 0 of 1 for a tensor tensor parallelism does not cut).  Its ``Spec`` says how the parts make the
whole tensor again.  After a failure:

    held   {survivor: {(key, part): Spec}}  what each survivor holds (its own state, or a buddy's copy)
    needs  {new rank: {key}}                the whole tensors each rank of the new layout cuts its shard from

    complete(held, needs)   every part of every needed key is held by someone: memory is enough
    transfers(held, needs)  [(source, destination, key, part)]: one holder per piece each destination
                            lacks (itself first: a piece a rank holds never travels), the load spread
                            over the holders, the same list on every rank

Example: tp 2 x dp 2 on four ranks, rank 1 (tp 1, dp 0) dies.  Its replica rank 3 (tp 1, dp 1) holds
every piece it held, so the three survivors can go on as dp 3 from memory: each new rank needs the whole
of every tensor, so rank 3 sends part 1 of each cut tensor to the new ranks 0 and 1 (old 0 and 2) and
receives part 0 from one of them - `transfers` lists exactly those messages.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Spec:
    """How one piece sits in its tensor: its part of ``parts`` along ``dim`` (``groups``: the
    tensor-parallel cut's interleaving, nn/parameter.Shard), the piece's and the whole tensor's shape."""
    parts: int
    dim: int | None
    groups: int | None
    shape: tuple
    full_shape: tuple
    dtype: str


def parts_of(held, key):
    """How many parts the old layout cut ``key`` into (None: no survivor holds any part of it)."""
    return next((spec.parts for pieces in held.values() for (k, _), spec in pieces.items() if k == key), None)


def holders(held, key, part):
    return sorted(rank for rank, pieces in held.items() if (key, part) in pieces)


def missing(held, needs):
    """The (key, part) pieces some new rank needs and no survivor holds, sorted (a key no survivor holds
    any part of: (key, None))."""
    gone = set()
    for key in sorted({k for keys in needs.values() for k in keys}):
        parts = parts_of(held, key)
        if parts is None:
            gone.add((key, None))
            continue
        gone.update((key, i) for i in range(parts) if not holders(held, key, i))
    return sorted(gone, key=lambda kp: (kp[0], -1 if kp[1] is None else kp[1]))


def complete(held, needs):
    return not missing(held, needs)


def transfers(held, needs):
    """[(source, destination, key, part)], destinations and keys in sorted order: every part of every key
    each destination needs, from the destination itself when it holds the piece, else from the holder
    with the fewest pieces to send so far (the lower rank on a tie)."""
    load = {rank: 0 for rank in held}
    out = []
    for dst in sorted(needs):
        for key in sorted(needs[dst]):
            for part in range(parts_of(held, key)):
                who = holders(held, key, part)
                src = dst if dst in who else min(who, key=lambda r: (load[r], r))
                if src != dst:
                    load[src] += 1
                out.append((src, dst, key, part))
    return out
