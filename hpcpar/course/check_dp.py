"""Data-parallel exercises: the ring all-reduce (simulated, then on MPI ranks), and the slice of a
bucket ZeRO-1 gives each rank."""
from types import SimpleNamespace

import numpy as np

from hpcpar.course.on_ranks import COLLECTIVES, Watched, check_ring_messages, groups, stage
from hpcpar.data_parallel.flat import FlatBuffer
from hpcpar.course.wrong import Wrong

# --- exercise 1: the ring all-reduce, simulated ------------------------------------------------------


def _marked(p, n, rng):
    """Rank r's array: random numbers, except the first element of each chunk, 2^r.  The first element
    of any partial sum then names the ranks it holds: bit r set <=> rank r's data is in it."""
    xs = [rng.standard_normal(n) for _ in range(p)]
    for r, x in enumerate(xs):
        x.reshape(p, -1)[:, 0] = 2.0 ** r
    return xs


def _content(chunk, xs, p):
    """(chunk index, set of ranks) whose chunk sum ``chunk`` is, or None."""
    first = float(chunk[0])
    if first != int(first) or not 0 < first < 2 ** p:
        return None
    ranks = {r for r in range(p) if int(first) >> r & 1}
    for c in range(p):
        want = sum(x.reshape(p, -1)[c] for r, x in enumerate(xs) if r in ranks)
        if np.allclose(chunk, want, rtol=1e-12, atol=1e-12):
            return c, ranks
    return None


def check_ring_allreduce(f):
    for p, n in ((4, 8), (3, 6), (2, 4), (5, 20)):
        xs = _marked(p, n, np.random.default_rng(p))
        held = [[{r} for _ in range(p)] for r in range(p)]   # held[r][c]: whose chunk c rank r has seen
        count = [0]

        def send(src, dst, chunk):
            count[0] += 1
            if dst != (src + 1) % p:
                raise Wrong(f"{p} ranks: rank {src} sent to rank {dst}; a ring sends only to rank + 1 (mod p)")
            if np.size(chunk) != n // p:
                raise Wrong(f"{p} ranks: message {count[0]} holds {np.size(chunk)} numbers; the ring moves "
                            f"one chunk, n/p = {n // p} numbers")
            what = _content(np.ravel(chunk), xs, p)
            if what is None:
                raise Wrong(f"{p} ranks: message {count[0]} (rank {src} -> {dst}) is not the sum of one chunk "
                            "over some ranks: send the chunk's data itself (your partial sum of it)")
            c, ranks = what
            if not ranks <= held[src][c]:
                raise Wrong(f"{p} ranks: message {count[0]}: rank {src} sends chunk {c} summed over ranks "
                            f"{sorted(ranks)}, but so far it has only received the data of {sorted(held[src][c])}")
            held[dst][c] |= ranks

        out = f([x.copy() for x in xs], send)
        want = sum(xs)
        if len(out) != p:
            raise Wrong(f"{p} ranks: return one array per rank, got {len(out)}")
        for r, y in enumerate(out):
            y = np.ravel(y)
            if y.shape != (n,) or not np.allclose(y, want, rtol=1e-12, atol=1e-12):
                i = int(np.flatnonzero(~np.isclose(y, want, rtol=1e-12, atol=1e-12))[0]) if y.shape == (n,) else 0
                raise Wrong(f"{p} ranks: rank {r} ends with shape {y.shape}" if y.shape != (n,) else
                            f"{p} ranks: rank {r}, element {i} (chunk {i // (n // p)}): got {y[i]:.6g}, "
                            f"the sum over ranks is {want[i]:.6g}")
            missing = [c for c in range(p) if held[r][c] != set(range(p))]
            if missing:
                raise Wrong(f"{p} ranks: rank {r} returns the sum, but the data of chunk {missing[0]} from "
                            f"ranks {sorted(set(range(p)) - held[r][missing[0]])} never reached it in a message")
        if count[0] != 2 * (p - 1) * p:
            raise Wrong(f"{p} ranks: {count[0]} messages; a ring all-reduce takes 2 (p - 1) steps of p "
                        f"messages = {2 * (p - 1) * p}")


# --- exercise 13: the ring all-reduce on MPI ranks ---------------------------------------------------


def ring_allreduce_mpi(x, comm):
    """Reference: in-place ring all-reduce of this rank's flat ``x`` (size divisible by p) with
    non-blocking sends: reduce-scatter, then all-gather; each step posts the receive from the left
    neighbour and the send to the right one, then waits for both (hpcpar.comm.wait_all)."""
    from hpcpar.comm import wait_all
    p, r = comm.size, comm.rank
    chunks = x.reshape(p, -1)                                # views: the sums land in x
    incoming = np.empty_like(chunks[0])
    right, left = (r + 1) % p, (r - 1) % p
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(p - 1):
            shift = s if phase == "reduce-scatter" else s - 1     # the chunk sent: r - shift (mod p)
            send_c, recv_c = (r - shift) % p, (r - shift - 1) % p
            wait_all([comm.irecv_(incoming, left, tag=s), comm.isend(chunks[send_c], right, tag=s)])
            if phase == "reduce-scatter":
                chunks[recv_c] += incoming
            else:
                chunks[recv_c] = incoming
    return x


def _ring_case(f, comm, n):
    """One ring of ``comm.size`` ranks on arrays of ``n`` numbers: sums, messages, requests."""
    p = comm.size
    what = f"{p} ranks, n = {n}"
    x = np.random.default_rng(10 * comm.rank + n).standard_normal(n)
    want = comm.all_reduce(x.copy())                     # MPI's own Allreduce: the contents to match
    watched, since = Watched(comm), dict(comm.stats.calls)
    got = f(x.copy(), watched)
    used = [op for op in COLLECTIVES if watched.calls(since).get(op)]
    if used:
        watched.unfinished()
        raise Wrong(f"{what}: the function called comm.{used[0]}; write the ring with point-to-point messages "
                    "only (comm.isend, comm.irecv_)")
    check_ring_messages(watched, what, 2 * (p - 1), 2 * (p - 1) * x.nbytes // p)
    got = np.ravel(np.asarray(got))
    if got.shape != x.shape or not np.allclose(got, want, rtol=1e-12, atol=1e-12):
        i = int(np.flatnonzero(~np.isclose(got, want, rtol=1e-12, atol=1e-12))[0]) if got.shape == x.shape else 0
        raise Wrong(f"{what}: returned shape {got.shape}, expected {x.shape}" if got.shape != x.shape else
                    f"{what}: element {i} (chunk {i // (n // p)}) is {got[i]:.6g}; Allreduce gives {want[i]:.6g}")


def check_ring_allreduce_mpi(f, world):
    """The ring at 4, 3 and 2 ranks (groups of the job's 4), on small arrays, and at 4 on 1 MB chunks,
    where a blocking send waits for its receive."""
    for p, comm in groups(world, (world.size, 3, 2)):
        for n in ((4 * p, p << 17) if p == world.size else (6 * p,)):
            stage(world, lambda: comm and _ring_case(f, comm, n))


# --- exercise 7: ZeRO-1's shard -----------------------------------------------------------------------


def zero1_shard(numel, dp, rank):
    """Reference: the [lo, hi) of a bucket of ``numel`` gradient numbers, padded as hpcpar pads it,
    that ``rank`` of ``dp`` updates under ZeRO-1."""
    grads = SimpleNamespace(data=np.zeros(numel), grad=np.zeros(numel))    # one parameter is all it takes
    flat = FlatBuffer([grads], SimpleNamespace(size=dp, rank=rank))
    return flat.lo, flat.hi


def check_zero1_shard(f):
    for numel, dp in ((12, 4), (10, 4), (7, 3), (5, 8), (7, 1)):
        for rank in range(dp):
            got, want = tuple(int(v) for v in f(numel, dp, rank)), zero1_shard(numel, dp, rank)
            if got != want:
                lo_hi = "lo" if got[0] != want[0] else "hi"
                raise Wrong(f"{numel} numbers, dp {dp}, rank {rank}: got [{got[0]}, {got[1]}); its {lo_hi} is "
                            "off (every rank's slice has the same length, and the slices together cover the "
                            "padded bucket in rank order)")


def check_zero1_in_trainer(m, world):
    """Exercise 7's shard as the trainer's ZeRO-1 ranges (hpcpar train --plug --zero 1): dp 2, 3 and 4."""
    from hpcpar.course.plugged import GPT, check_in_trainer
    check_in_trainer(m, world, GPT, [dict(dp=n, zero=1) for n in (2, 3, world.size)])
