"""Exercise 38, a solution: the blocks ring attention skips for a window of documents."""


def positions(T, cp, j):
    c = T // (2 * cp)
    return list(range(j * c, (j + 1) * c)) + list(range((2 * cp - 1 - j) * c, (2 * cp - j) * c))


def ring_plan(docs, cp, window=0):
    T = len(docs)

    def sees(q, k):
        return k <= q and docs[k] == docs[q] and (not window or q - k < window)

    plan = []
    for r in range(cp):
        mine, row = positions(T, cp, r), []
        for s in range(cp):
            j = (r - s) % cp
            theirs = positions(T, cp, j)
            queries = sum(any(sees(q, k) for k in theirs) for q in mine)
            keys = sum(any(sees(q, k) for q in mine) for k in theirs)
            row.append((j, queries, keys))
        plan.append(row)
    return plan
