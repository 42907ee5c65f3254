"""Exercise 10, a solution: resharding, fused groups included."""
import numpy as np


def reshard(pieces, dim, new_parts, groups=1):
    per_group = [np.concatenate([np.split(p, groups, axis=dim)[g] for p in pieces], axis=dim)
                 for g in range(groups)]
    cut = [np.split(whole, new_parts, axis=dim) for whole in per_group]
    return [np.concatenate([cut[g][i] for g in range(groups)], axis=dim) for i in range(new_parts)]
