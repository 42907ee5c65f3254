"""In-job recovery: after ranks die, where each survivor sits in the new grid and who sends whom which piece
of the model state (docs/reliability.md "Going on without a rank"; training/recovery.py, the engine's
rebuild; checkpoint/inventory.py, the transfer list; comm/grid.py, the grids)."""
from hpcpar.checkpoint.inventory import Spec, complete, transfers
from hpcpar.comm.grid import GridLayout
from hpcpar.course.wrong import Wrong
from hpcpar.training.restore import with_state

LAYERS = 4
STATES = ("exp_avg", "exp_avg_sq")            # AdamW's two moments, saved beside each weight


def model():
    """{name: cut by tensor parallelism}: a small GPT's tensors, in no particular order."""
    out = {"wte.weight": True, "ln_f.weight": False, "lm_head.weight": True}
    for i in range(LAYERS):
        out.update({f"h.{i}.attn.weight": True, f"h.{i}.ln.weight": False})
    return out


def stage_of(name, pp):
    """The pipeline stage that holds tensor ``name`` when the model is cut into ``pp`` stages."""
    if name.startswith("h."):
        return int(name.split(".")[1]) * pp // LAYERS
    return 0 if name.startswith("wte") else pp - 1


def _grid(sizes):
    tp, pp, dp = sizes
    return GridLayout(tp * pp * dp, tp=tp, pp=pp, dp=dp)


def _held(old, survivors, tensors, stage):
    """{new rank: {(key, part): Spec}}: what each survivor holds of the state (ZeRO 0: all of its shard),
    named as rank_tensors names it - a weight and its optimizer state, the part its tp index cut."""
    grid, held = _grid(old), {}
    for i, rank in enumerate(survivors):
        at = grid.index(rank)
        held[i] = {}
        for name, cut in tensors.items():
            if stage(name, old[1]) != at["pp"]:
                continue
            spec = Spec(old[0] if cut else 1, 0 if cut else None, None, (1,), (old[0] if cut else 1,), "float64")
            for key in [name] + [f"optimizer/{s}/{name}" for s in STATES]:
                held[i][(key, at["tp"] if cut else 0)] = spec
    return held


def recovery_plan(old, dead, new, tensors, stage, me):
    """Reference: (places, plan) - each survivor's new rank and its (tp, pp, dp) in the new grid (None: the
    layout leaves it idle), and inventory.transfers' list, the same whichever rank ``me`` computes it."""
    survivors = [r for r in range(old[0] * old[1] * old[2]) if r not in dead]   # MPI_Comm_shrink keeps the order
    grid = _grid(new)
    ranks = grid.world                                  # the first ranks of the shrunken world take the layout
    places = {}
    for i, rank in enumerate(survivors):
        at = grid.index(i) if i < ranks else None
        places[rank] = (i, (at["tp"], at["pp"], at["dp"]) if at else None)
    held = _held(old, survivors, tensors, stage)
    needs = {i: {n for n in tensors if stage(n, new[1]) == grid.index(i)["pp"]} for i in range(ranks)}
    return places, transfers(held, with_state(needs, held))


CASES = (((2, 1, 2), [1], (1, 1, 3)),          # inventory.py's example
         ((1, 2, 2), [0], (1, 1, 3)),          # the first stage's only other replica takes over
         ((2, 2, 2), [5], (1, 2, 2)),          # 7 survivors, 4 in the layout: the idle ones still send
         ((2, 1, 3), [1, 4], (2, 1, 2)),       # two dead
         ((4, 1, 2), [2], (2, 1, 3)),          # tp 4 to tp 2: every part of 4 still travels
         ((1, 4, 2), [3, 4], (1, 2, 3)))


def check_recovery_plan(f):
    tensors = model()
    for old, dead, new in CASES:
        where = f"tp {old[0]} x pp {old[1]} x dp {old[2]}, ranks {dead} dead, going on as tp {new[0]} x pp " \
                f"{new[1]} x dp {new[2]}"
        places, want = recovery_plan(old, dead, new, tensors, stage_of, 0)
        survivors = sorted(places)
        held = _held(old, survivors, tensors, stage_of)
        # each case keeps a replica of every piece: the state comes from memory, not a copy or a checkpoint
        assert complete(held, {i: {k for _, d, k, _ in want if d == i} for i in range(len(survivors))})
        answers = [f(old, list(dead), new, dict(tensors), stage_of, me) for me in range(len(survivors))]
        for got_places, _ in answers:
            got = {int(r): (int(n), None if at is None else tuple(int(x) for x in at))
                   for r, (n, at) in dict(got_places).items()}
            if got != places:
                r = next((r for r in survivors if got.get(r) != places[r]), None)
                if r is None:
                    raise Wrong(f"{where}: places holds {sorted(got)}; give one entry per survivor, by its old rank")
                raise Wrong(f"{where}: old rank {r} goes on as {got.get(r)}, expected {places[r]} (new rank, "
                            f"(tp, pp, dp) or None when idle)")
        plans = [[tuple(e) for e in plan] for _, plan in answers]
        for me, plan in enumerate(plans[1:], 1):
            if plan != plans[0]:
                i = next((i for i, (a, b) in enumerate(zip(plan, plans[0])) if a != b), min(len(plan), len(plans[0])))
                raise Wrong(f"{where}: new rank {me} computes another list than new rank 0 (from entry {i} on): the "
                            f"exchange tags each message with its place in the list, so every rank builds the same one")
        _compare(where, [(int(s), int(d), str(k), int(p)) for s, d, k, p in plans[0]], want, held)


def _compare(where, got, want, held):
    need, have = {e[1:] for e in want}, {e[1:] for e in got}
    if need - have:
        d, k, p = min(need - have)
        if k.startswith("optimizer/") and not any(e[2].startswith("optimizer/") for e in got):
            raise Wrong(f"{where}: no optimizer state travels, and new rank {d} needs {k!r}: AdamW's moments go "
                        f"where their weights go")
        raise Wrong(f"{where}: nothing gives new rank {d} ({k!r}, part {p}): a rank needs every part of every "
                    f"tensor of its new stage, and their optimizer state, to cut its own shard")
    if have - need:
        d, k, p = min(have - need)
        raise Wrong(f"{where}: new rank {d} is given ({k!r}, part {p}), which its new stage does not use")
    if len(got) != len(have):
        raise Wrong(f"{where}: a destination gets some piece twice: list each piece a destination needs once")
    for i, (s, d, k, p) in enumerate(got):
        if (k, p) not in held.get(s, {}):
            raise Wrong(f"{where}: entry {i} takes ({k!r}, part {p}) from new rank {s}, which does not hold it - "
                        f"only the survivors' pieces exist, numbered as the shrunken world numbers them")
        if s != d and (k, p) in held[d]:
            raise Wrong(f"{where}: entry {i} sends new rank {d} ({k!r}, part {p}), which it already holds")
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            why = f"new rank {w[0]} is the holder with the fewest pieces to send so far" if g[1:] == w[1:] else \
                "another order: destinations, then keys, then parts, each increasing"
            raise Wrong(f"{where}: entry {i} is {g}, expected {w} - {why}")
