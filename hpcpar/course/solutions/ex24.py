"""Exercise 24, a solution: ZB-V's order for one rank."""


def zb_v(rank, stages, microbatches):
    p, m, done, out = stages, microbatches, {}, []

    def run(op, chunk):
        i = done.get((op, chunk), 0)
        done[op, chunk] = i + 1
        out.append((op, i, chunk))
    for _ in range(2 * (p - rank) - 1):                 # micro-batch 0's way down and back up
        run("F", 0)
    for _ in range(rank):
        run("F", 1)
        run("F", 0)
    for _ in range(p - rank):
        run("F", 1)
        run("B", 1)
        run("W", 1)
    while done.get(("F", 0), 0) < m or done.get(("F", 1), 0) < done.get(("F", 0), 0):
        if done.get(("F", 0), 0) < m:
            run("F", 0)
        for op, chunk in (("B", 0), ("W", 0), ("F", 1), ("B", 1), ("W", 1)):
            run(op, chunk)
    for _ in range(rank):                               # the drain: backwards first ...
        run("B", 0)
        run("B", 1)
    for _ in range(p - rank):
        run("B", 0)
        run("W", 0)
    for chunk in (1, 0):                                # ... the Ws that waited, last
        for _ in range(done.get(("B", chunk), 0) - done.get(("W", chunk), 0)):
            run("W", chunk)
    return [a for a in out if a[1] < m]
