"""(cp) Ring attention: bytes per step against the formula, and how much of the ring hides behind compute.

One attention layer's core, forward and backward, on cp ranks that each hold T/cp tokens of a
sequence (hpcpar/context_parallel/ring.py).  Three cases, timed side by side:

  ring      the real thing: each hop in flight while a block computes
  compute   the same blocks on the same ranks with no message at all (what the ring cannot go below)
  comm      the same hops with no block computed (what the messages cost alone)

exposed = ring - compute is the communication the ring did not hide, and hidden = 1 - exposed / comm.
Bytes each rank sends per layer and step, from the counted communicator, against

    (cp - 1) [K|V] blocks forward + (cp - 1) [K|V] blocks and cp [dK|dV] blocks backward
    = (3 cp - 2) x 2 B NH (T / cp) HS x bytes per number.

Messages move only when MPI gets the CPU: MPICH has no progress thread, so on this machine a hop
that needs a rendezvous completes in the wait after the block, and "hidden" is what that leaves.
"""
import time

import numpy as np
from mpi4py import MPI

from hpcpar.tools.bench.common import Result, interleave, ms, pct, size, slowest_rank
from hpcpar.comm import Communicator
from hpcpar.context_parallel.ring import Hop, RingAttention, pair
from hpcpar.ops.ring_attention import balanced_positions, block_backward, block_forward, merge, ring_source, scale

SHAPE = dict(B=1, NH=8, T=1024, HS=64)              # one layer of a small model at a longer context
QUICK = dict(B=1, NH=4, T=512, HS=32)


def ring_bytes(cp, B, NH, T, HS, itemsize):
    """Bytes one rank sends per layer, forward and backward (the formula above)."""
    return (3 * cp - 2) * 2 * B * NH * (T // cp) * HS * itemsize


def run(quick):
    world = MPI.COMM_WORLD
    comm = Communicator(world, "cp")
    cp, r = comm.size, comm.rank
    d = QUICK if quick else SHAPE
    rng = np.random.default_rng(r)
    q, k, v, do = (rng.standard_normal((d["B"], d["NH"], d["T"] // cp, d["HS"])).astype(np.float32)
                   for _ in range(4))
    ring = RingAttention(comm)
    pos = [balanced_positions(d["T"], cp, j) for j in range(cp)]
    grads = [np.empty_like(q) for _ in range(3)]
    waits = []                                        # seconds blocked in the ring's waits, per call

    def real():
        before = comm.stats.seconds["wait"]
        o, cache = ring.forward(q, k, v, None, False, None)
        ring.backward(do, cache, grads)
        waits.append(comm.stats.seconds["wait"] - before)

    def compute():                                    # the ring's blocks, with this rank's K/V standing in
        qs = scale(q)
        o, lse = block_forward(qs, k, v, pos[r], pos[r])
        for s in range(1, cp):
            o, lse = merge(o, lse, *block_forward(qs, k, v, pos[r], pos[ring_source(r, s, cp)]))
        delta = (do * o).sum(axis=-1)
        for s in range(cp):
            block_backward(do, delta, qs, k, v, pos[r], pos[ring_source(r, s, cp)], lse)

    def messages():                                   # the ring's hops, with nothing to overlap
        kv = pair(k, v)
        for _ in range(2 * (cp - 1)):
            kv = Hop(comm, kv, 1, "kv").wait()
        for _ in range(cp):
            kv = Hop(comm, kv, 2, "dkv").wait()

    comm.stats.reset()
    real()
    sent = comm.stats.bytes["send"]
    rounds = 3 if quick else 8
    times = slowest_rank(world, interleave({"ring": real, "compute": compute, "comm": messages}, rounds,
                                           time.perf_counter, world.Barrier))
    waited = min(slowest_rank(world, {"wait": waits})["wait"])
    if r:
        return None
    t = {name: min(ts) for name, ts in times.items()}
    exposed = max(0.0, t["ring"] - t["compute"])
    hidden = min(1.0, max(0.0, 1 - exposed / t["comm"]))
    formula = ring_bytes(cp, d["B"], d["NH"], d["T"], d["HS"], q.itemsize)
    res = Result()
    shape = f"B {d['B']}, {d['NH']} heads, T {d['T']} ({d['T'] // cp} per rank), head size {d['HS']}, float32"
    res.table(f"Ring attention, forward + backward of one layer, cp = {cp} ({shape}; best of {rounds} rounds, "
              f"slowest rank)",
              ["ring", "compute alone", "messages alone", "exposed (ring - compute)", "waited in the ring",
               "hidden", "bytes sent / rank", "formula (3cp-2) x [K|V]"],
              [[ms(t["ring"]), ms(t["compute"]), ms(t["comm"]), ms(exposed), ms(waited), pct(hidden), size(sent),
                size(formula)]],
              ["hidden = 1 - exposed / messages alone.  The ranks share the machine's cores: a message is a "
               "memory copy through MPI's shared memory, and it progresses only inside MPI calls.",
               "exposed also holds every wait for the other ranks' blocks: on a loaded machine their pace "
               "differs step by step, and the ring goes at the slowest rank's.  Waited: the time blocked "
               "completing the hops (the least over the rounds of the slowest rank's), the same thing seen "
               "from inside."])
    res.target("ring bytes per layer and step equal the formula", "= (3cp-2) x [K|V] block", size(sent),
               sent == formula)
    res.figures = {"cp": cp, "shape": d, "seconds": t, "exposed_s": exposed, "waited_s": waited, "hidden": hidden,
                   "bytes_sent": sent, "bytes_formula": formula}
    return res
