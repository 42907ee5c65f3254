"""Exercise 41, a solution: the survivors' places, and the transfers that rebuild the state."""

STATES = ("exp_avg", "exp_avg_sq")


def coords(rank, tp, pp, dp):
    return rank % tp, rank // (tp * dp), rank // tp % dp


def recovery_plan(old, dead, new, tensors, stage, me):
    survivors = [r for r in range(old[0] * old[1] * old[2]) if r not in dead]
    used = new[0] * new[1] * new[2]
    places = {r: (i, coords(i, *new) if i < used else None) for i, r in enumerate(survivors)}
    held = {}                                   # new rank -> {(key, part)}
    for i, r in enumerate(survivors):
        tp_i, pp_i, _ = coords(r, *old)
        held[i] = set()
        for name, cut in tensors.items():
            if stage(name, old[1]) == pp_i:
                for key in [name] + [f"optimizer/{s}/{name}" for s in STATES]:
                    held[i].add((key, tp_i if cut else 0))
    sent = {i: 0 for i in held}
    plan = []
    for dst in range(used):
        keys = sorted(key for name in tensors if stage(name, new[1]) == coords(dst, *new)[1]
                      for key in [name] + [f"optimizer/{s}/{name}" for s in STATES])
        for key in keys:
            name = key.rsplit("/", 1)[-1]
            for part in range(old[0] if tensors[name] else 1):
                if (key, part) in held[dst]:
                    src = dst
                else:
                    src = min((i for i in held if (key, part) in held[i]), key=lambda i: (sent[i], i))
                    sent[src] += 1
                plan.append((src, dst, key, part))
    return places, plan
