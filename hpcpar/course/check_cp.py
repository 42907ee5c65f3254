"""Context-parallel exercises: merging two online-softmax partials, and which key/value block a rank
holds at each step of the ring (hpcpar/ops/ring_attention.py, docs/context_parallel.md)."""
import numpy as np

from hpcpar.course.wrong import Wrong
from hpcpar.ops.ring_attention import balanced_positions, block_forward, merge, ring_source, scale


def _partials(rng, q_pos, k_pos):
    """O_b, lse_b of queries at q_pos against keys at k_pos (causal), the way ring attention makes them."""
    q, k, v = (rng.standard_normal((1, 2, len(p), 4)) for p in (q_pos, k_pos, k_pos))
    return block_forward(scale(q), k, v, np.asarray(q_pos), np.asarray(k_pos))


def check_merge(f):
    rng = np.random.default_rng(3)
    cases = [("two blocks every query sees", [8, 9, 10], [0, 1, 2], [3, 4, 5]),
             ("scores far above 700 (exp overflows without the max)", [8, 9, 10], [0, 1, 2], [3, 4, 5]),
             ("a block that some queries do not see (lse = -inf there)", [2, 3, 6], [0, 1], [4, 5]),
             ("a query that sees neither block", [0, 5], [1, 2], [6, 7])]
    for what, q_pos, k1, k2 in cases:
        o1, lse1 = _partials(rng, q_pos, k1)
        o2, lse2 = _partials(rng, q_pos, k2)
        if "700" in what:
            lse1, lse2 = lse1 + 800.0, lse2 + 801.0       # the same weights, shifted: exp(800) is inf
        want_o, want_lse = merge(o1, lse1, o2, lse2)
        with np.errstate(all="ignore"):
            got_o, got_lse = (np.asarray(a) for a in f(o1.copy(), lse1.copy(), o2.copy(), lse2.copy()))
        for name, got, want in (("lse", got_lse, want_lse), ("O", got_o, want_o)):
            if got.shape != want.shape:
                raise Wrong(f"{what}: {name} has shape {got.shape}, expected {want.shape}")
            bad = ~np.isclose(got, want, rtol=1e-12, atol=1e-12) & ~((got == want) | (np.isnan(got) & np.isnan(want)))
            if bad.any():
                i = tuple(int(j) for j in np.argwhere(bad)[0])
                raise Wrong(f"{what}: {name}{list(i)} is {got[i]:.6g}, expected {want[i]:.6g}")


def kv_positions(rank, step, cp, seq_len):
    """Reference: the global positions of the key/value block rank ``rank`` holds at ring step ``step``:
    the block of rank (rank - step) mod cp, laid out by the causal balance (chunks r and 2cp-1-r)."""
    return [int(p) for p in balanced_positions(seq_len, cp, ring_source(rank, step, cp))]


def check_kv_positions(f):
    for cp, seq_len in ((2, 8), (4, 16), (3, 24), (4, 32)):
        for rank in range(cp):
            for step in range(cp):
                got, want = [int(p) for p in f(rank, step, cp, seq_len)], kv_positions(rank, step, cp, seq_len)
                if got != want:
                    hint = "the right block, in another order" if sorted(got) == sorted(want) else \
                        "the positions of another rank's block" if any(
                            got == kv_positions(o, 0, cp, seq_len) for o in range(cp)) else \
                        "positions no rank holds as its block"
                    raise Wrong(f"cp {cp}, {seq_len} tokens, rank {rank}, step {step}: got {got} - {hint}")


# --- exercise 31: ring attention's forward, in the trainer ----------------------------------------------


def _ring_case(m, comm):
    """The student's ring forward on ``comm`` against the engine's (context_parallel/ring.py), and its
    messages: only to rank + 1 and from rank - 1, every request completed, no collective."""
    from hpcpar.context_parallel.ring import RingAttention
    from hpcpar.course.on_ranks import COLLECTIVES, Watched, check_ring_messages
    cp, r = comm.size, comm.rank
    rng = np.random.default_rng(31 + r)
    T = 4 * cp
    pos = [balanced_positions(T, cp, j) for j in range(cp)]
    qs, k, v = (rng.standard_normal((2, 3, 4, 4)) for _ in range(3))
    want_o, want_lse = RingAttention(comm).ring_forward(qs, k, v, pos)
    watched, since = Watched(comm), dict(comm.stats.calls)
    got = m.ring_attention_forward(qs.copy(), k.copy(), v.copy(), [p.copy() for p in pos], watched, block_forward)
    what = f"cp {cp}"
    used = [op for op in COLLECTIVES if watched.calls(since).get(op)]
    if used:
        watched.unfinished()
        raise Wrong(f"{what}: the ring called comm.{used[0]}; pass the blocks with comm.isend and comm.irecv_")
    check_ring_messages(watched, what, (cp - 1, 2 * (cp - 1)), (cp - 1) * (k.nbytes + v.nbytes))
    for name, g, w in zip(("o", "lse"), got, (want_o, want_lse)):
        g = np.asarray(g)
        if g.shape != w.shape:
            raise Wrong(f"{what}, rank {r}: {name} has shape {g.shape}, expected {w.shape}")
        bad = ~np.isclose(g, w, rtol=1e-12, atol=1e-12) & ~(g == w)
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            raise Wrong(f"{what}, rank {r}: {name}{list(i)} is {g[i]:.6g}, the ring gives {w[i]:.6g} (query at "
                        f"position {pos[r][i[2]]})")


def check_ring_forward(m, world):
    """The ring on 2, 3 and 4 ranks, then in the trainer at cp 2 and cp 4."""
    from hpcpar.course.on_ranks import groups, stage
    from hpcpar.course.plugged import GPT, check_in_trainer
    for _, comm in groups(world, (2, 3, world.size)):
        stage(world, lambda: comm and _ring_case(m, comm))
    check_in_trainer(m, world, GPT, [dict(cp=2), dict(cp=world.size)])
