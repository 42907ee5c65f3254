"""Exercise 11, a solution: the bubble of a traced step."""


def bubble(spans):
    busy = sum(b - a for rank in spans for a, b in rank)
    start = min(a for rank in spans for a, _ in rank)
    end = max(b for rank in spans for _, b in rank)
    return 1 - busy / (len(spans) * (end - start))
