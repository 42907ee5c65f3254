"""Exercise 21, a solution: culprits and waits from flight records."""


def hang_diagnosis(records, world):
    alive = {r: rec for r, rec in records.items() if not rec.get("dead")}
    waits = {}
    for r, rec in alive.items():
        stuck = [op for op in rec.get("ops", []) if op["end"] is None and op["wait"] is not None]
        if stuck:
            op = min(stuck, key=lambda o: o["id"])
            waits[r] = (op["group"], op["op"], op["seq"] if op["peer"] is None else op["peer"])
    culprits = sorted(r for r in range(world) if r not in alive) or sorted(set(alive) - set(waits))
    return culprits, waits
