"""Exercise 12, a solution: the share of communication hidden behind compute."""


def merged(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def hidden_share(comm, compute):
    comm, compute = merged(comm), merged(compute)
    total = sum(b - a for a, b in comm)
    hidden = sum(max(0, min(b, d) - max(a, c)) for a, b in comm for c, d in compute)
    return hidden / total if total else 0.0
