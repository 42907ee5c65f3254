"""Exercise 36, a solution: which ranks' maxima make a sharded weight's amax."""
from itertools import product


def amax_ranks(rank, sizes, layer, scaling, fp8_gather=False):
    order = ("tp", "cp", "dp", "pp")
    coords, r = {}, rank
    for a in order:
        coords[a], r = r % sizes[a], r // sizes[a]
    cut = "tp" if (layer == "row" or scaling == "tensor") else None      # K cut in a row layer, M in a column
    spread = {cut} - {None} | ({"dp", "cp"} if fp8_gather else set())
    out = []
    for values in product(*(range(sizes[a]) if a in spread else [coords[a]] for a in order)):
        n, stride = 0, 1
        for a, v in zip(order, values):
            n, stride = n + v * stride, stride * sizes[a]
        out.append(n)
    return sorted(out)
