"""Exercise 23, a solution: ZeRO-3's gather before a unit's forward, free after it."""
import numpy as np


def zero3_forward(units, layers, x, comm):
    p, r = comm.size, comm.rank
    flight = {}

    def post(i):
        shard = units[i].shard
        k = len(shard)
        full = np.empty(p * k, dtype=shard.dtype)        # the shard's dtype: the compute dtype
        full[r * k:(r + 1) * k] = shard
        flight[i] = (full, comm.iall_gather_(full))
    post(0)
    for i, unit in enumerate(units):
        full, request = flight.pop(i)
        request.wait()
        if i + 1 < len(units):
            post(i + 1)                                  # prefetch: travels while this unit computes
        for param, a, b in unit.segments:
            param.data = full[a:b].reshape(param.data.shape)
        x = layers[i](x)
        for param, a, b in unit.segments:
            param.data = None
        full = None                                      # the last reference: the buffer is freed
    return x
