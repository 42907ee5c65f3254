"""Exercise 29, a solution: causal attention in blocks of query rows."""
import numpy as np


def causal_blocks_forward(q, k, v, block):
    T, HS = q.shape[-2:]
    o, ps = np.empty_like(q), []
    for a in range(0, T, block):
        z = min(a + block, T)
        s = q[:, :, a:z] @ k[:, :, :z].swapaxes(-1, -2) / np.sqrt(HS)
        s += np.triu(np.full((z - a, z), -np.inf), a + 1)        # keys after each row's query
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        o[:, :, a:z] = p @ v[:, :, :z]
        ps.append(p)
    return o, ps
