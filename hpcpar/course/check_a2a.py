"""All-to-all exercises: the MoE's dispatch and combine (hpcpar/ops/moe.py, expert_parallel/dispatch.py,
docs/moe.md), the Ulysses transpose, the sequence cut of a cp group turned into a head cut
(hpcpar/context_parallel/transpose.py, docs/context_parallel.md), and the bytes of expert parallelism's
all-to-alls as the planner counts them (hpcpar/tools/plan/experts.py)."""
import numpy as np

from hpcpar.context_parallel.transpose import simulate_seq_to_heads
from hpcpar.course.wrong import Wrong, check_pair
from hpcpar.ops.moe import combine_forward, route_order, slots
from hpcpar.ops.ring_attention import balanced_positions


def seq_to_heads(parts, positions):
    """Reference: parts[r] (B, H, T/p, HS) of rank r's tokens at ``positions[r]`` -> list over ranks j of
    (B, H/p, T, HS): heads j H/p .. (j+1) H/p - 1 of every token, in sequence order."""
    return simulate_seq_to_heads(parts, [np.asarray(p) for p in positions])


def check_seq_to_heads(f):
    rng = np.random.default_rng(26)
    cases = [("2 ranks, contiguous halves of the sequence", 2, lambda T, p: [np.arange(r * T // p, (r + 1) * T // p)
                                                                          for r in range(p)]),
             ("2 ranks, the causal balance (chunks r and 2p-1-r)", 2, lambda T, p: [balanced_positions(T, p, r)
                                                                                  for r in range(p)]),
             ("4 ranks, the causal balance", 4, lambda T, p: [balanced_positions(T, p, r) for r in range(p)])]
    for what, p, cut in cases:
        T, H = 16, 8
        positions = cut(T, p)
        whole = rng.standard_normal((2, H, T, 3))
        parts = [whole[:, :, pos].copy() for pos in positions]
        got = f([x.copy() for x in parts], [pos.copy() for pos in positions])
        want = seq_to_heads(parts, positions)
        if len(got) != p:
            raise Wrong(f"{what}: {len(got)} arrays, expected one per rank ({p})")
        for j, (g, w) in enumerate(zip(got, want)):
            g = np.asarray(g)
            if g.shape != w.shape:
                raise Wrong(f"{what}: rank {j} gets shape {g.shape}, expected {w.shape} (B, H/p, T, HS)")
            bad = g != w
            if bad.any():
                b, h, t, _ = (int(i) for i in np.argwhere(bad)[0])
                raise Wrong(f"{what}: rank {j}, its head {h}, token {t} of the sequence is wrong")


def dispatch_combine(idx, w, n_expert, ep, ye):
    """Reference: router choices idx (N, k), weights w (N, k), E experts on ep ranks (E/ep consecutive
    experts each), the experts' outputs ye (N k, C) in dispatch order -> (order, send, y): the
    permutation of the N k assignments that makes each expert's rows contiguous (token order within an
    expert), the rows sent to each rank, and y (N, C) = sum over a token's choices of weight x output."""
    order = route_order(idx, n_expert)[0]
    send = np.bincount(idx.reshape(-1), minlength=n_expert).reshape(ep, -1).sum(axis=1)
    return order, send, combine_forward(ye, w, slots(order, *idx.shape))


def check_dispatch_combine(f):
    rng = np.random.default_rng(25)
    for N, k, E, ep in ((6, 2, 4, 2), (8, 2, 8, 4), (5, 3, 6, 3), (7, 1, 4, 2)):
        what = f"{N} tokens, top-{k} of {E} experts on {ep} ranks"
        idx = np.stack([rng.choice(E, k, replace=False) for _ in range(N)])
        w = rng.random((N, k))
        ye = rng.standard_normal((N * k, 3))
        got = f(idx.copy(), w.copy(), E, ep, ye.copy())
        want = dispatch_combine(idx, w, E, ep, ye)
        for name, g, v in zip(("order", "send", "y"), got, want):
            g = np.asarray(g)
            if g.shape != v.shape:
                raise Wrong(f"{what}: {name} has shape {g.shape}, expected {v.shape}")
            bad = ~np.isclose(g, v, rtol=1e-12, atol=1e-12)
            if bad.any():
                i = tuple(int(j) for j in np.argwhere(bad)[0])
                raise Wrong(f"{what}: {name}{list(i)} is {g[i]:.6g}, not what the package gives")


# --- exercise 28: predict the bytes of the expert-parallel all-to-alls ----------------------------------

EP_RUN = dict(model="mixtral-tiny", dp=4, dtype="float64", batch_size=16)      # on 4 ranks


def ep_rows_bytes():
    """Reference: the bytes one rank hands MPI in a step for the rows of the all-to-alls (dispatch and
    combine, forward and backward: 4 a MoE layer and micro-batch, plan/experts.all_to_all_times) of
    EP_RUN at ep 2 and at ep 4, by the planner's count of one (plan/experts.dispatch_bytes: the
    rank's tokens x top_k rows of d_model numbers, its own included)."""
    from dataclasses import replace

    from hpcpar.tools.plan.experts import dispatch_bytes
    from hpcpar.tools.plan.measured import planner_view
    from hpcpar.training.config import TrainConfig, check
    from hpcpar.training.models import model_config
    out = []
    for ep in (2, 4):
        cfg = check(TrainConfig(**EP_RUN, ep=ep), 4)
        mcfg = replace(model_config(cfg), vocab_size=32)       # the data's vocabulary: no part of the rows
        job, lay = planner_view(cfg, mcfg)
        one = dispatch_bytes(job.model, lay, job.seq_len // lay.cp * lay.mb, job.elem_bytes)
        out.append(int(4 * mcfg.n_layer * cfg.microbatches * one))
    return tuple(out)


def check_ep_rows_bytes(answer):
    check_pair(answer, ep_rows_bytes(), ("ep 2", "ep 4"), "a pair of numbers of bytes (at ep 2, at ep 4)",
               "the bytes")


# --- exercise 32: the experts' all-to-alls, in the trainer ----------------------------------------------

N_EXPERT = 12                   # divides by 2, 3 and 4 ranks


class _Experts:
    """Stands in for a rank's experts: writes down the rows and offsets it is given, and returns each
    row times (1 + its local expert), so that rows handed back in the wrong order show."""

    def forward(self, xe, local, ctx=None):
        self.xe, self.local = np.array(xe), [int(o) for o in local]
        scale = np.repeat(np.arange(1, len(local)), np.diff(self.local))[:, None]
        return xe * scale, None


def _expert_case(m, comm):
    from hpcpar.expert_parallel.dispatch import ExpertParallel
    ep, r = comm.size, comm.rank
    rng = np.random.default_rng(32 + r)
    counts = rng.integers(0, 4, N_EXPERT)                                   # this rank's rows per expert
    counts[r] = 0                                                           # some expert gets none from it
    xs = rng.standard_normal((int(counts.sum()), 3))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    engine = _Experts()
    want_ys, _ = ExpertParallel(comm, N_EXPERT).forward(engine, xs, offsets)
    what = f"ep {ep}, rank {r}"
    xe, local, plan = m.expert_dispatch(xs.copy(), counts.copy(), comm)
    if [int(o) for o in local] != engine.local:
        raise Wrong(f"{what}: the local experts' offsets are {[int(o) for o in local]}, expected {engine.local} "
                    "(rows of each of this rank's experts, from every rank)")
    xe = np.asarray(xe)
    if xe.shape != engine.xe.shape or not np.array_equal(xe, engine.xe):
        bad = next((i for i in range(min(len(xe), len(engine.xe))) if not np.array_equal(xe[i], engine.xe[i])), None)
        raise Wrong(f"{what}: the experts receive {xe.shape[0]} rows, expected {engine.xe.shape[0]}" if bad is None
                    else f"{what}: row {bad} of the experts' input is not the one the dispatch delivers there "
                         "(expert by expert, and within an expert source rank by source rank)")
    ys = np.asarray(m.expert_combine(engine.forward(xe, local)[0], plan, comm))
    if ys.shape != want_ys.shape or not np.array_equal(ys, want_ys):
        raise Wrong(f"{what}: the combine hands back {ys.shape[0]} rows, not each in its token's place" if
                    ys.shape == want_ys.shape else f"{what}: the combine hands back shape {ys.shape}, "
                                                   f"expected {want_ys.shape}")


def check_expert_dispatch(m, world):
    """The all-to-alls on 2, 3 and 4 ranks, then in the trainer at ep 2 and ep 4 (moe-tiny)."""
    from hpcpar.course.on_ranks import groups, stage
    from hpcpar.course.plugged import MOE, check_in_trainer
    for _, comm in groups(world, (2, 3, world.size)):
        stage(world, lambda: comm and _expert_case(m, comm))
    check_in_trainer(m, world, MOE, [dict(dp=2, ep=2), dict(dp=world.size, ep=world.size)])
