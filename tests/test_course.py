"""The course's checkers grade the work: for every exercise the blank file fails with a message that says
what to do, the reference passes, and each known wrong-but-plausible answer (WRONG, at least three per
exercise) fails with a "not yet" that points at a difference without giving the answer away.  The
lessons: every reference resolves, and no lesson prints the answer to its own prediction."""
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcpar.course import check_hangs, check_pp
from hpcpar.course.catalog import BY_NUMBER, EXERCISES
from hpcpar.course.exercise import load, next_hint, reference, verdict
from mpitools import run

DOCS = Path(__file__).resolve().parent.parent / "docs"
COURSE = DOCS / "course"
IDS = [f"ex{e.number:02d}" for e in EXERCISES]

RING_START = "import numpy as np\ndef ring_allreduce(xs, send):\n    p = len(xs)\n"
MPI_RING = ("import numpy as np\nfrom hpcpar.comm import wait_all\ndef ring_allreduce(x, comm):\n"
            "    p, r = comm.size, comm.rank\n    c = x.reshape(p, -1)\n    buf = np.empty_like(c[0])\n")
TP_MLP = ("import numpy as np\ndef tp_mlp(comm, x, w1, b1, w2, b2, dy):\n    h = np.tanh(x @ w1 + b1)\n"
          "{forward}\n    dh = dy @ w2.T\n{backward}\n    return y, dx\n")
NAIVE = check_pp.naive_program()
GOOD = check_pp.unblocked_program()


def _program(lists):
    return "PROGRAM = " + repr([list(words) for words in lists]) + "\n"


# exercise 24: ZB-V's order written as the lesson's hints say, with WARM warm-up forwards and STEADY as the
# steady state's five actions after each chunk-0 forward; the wrong answers change one of them
ZBV = ('def zb_v(rank, stages, microbatches):\n'
       '    p, m, n = stages, microbatches, {}\n'
       '    out = []\n'
       '    def nxt(op, c):\n'
       '        i = n.get((op, c), 0)\n'
       '        n[op, c] = i + 1\n'
       '        out.append((op, i, c))\n'
       '    for _ in range(WARM):\n'
       "        nxt('F', 0)\n"
       '    for _ in range(rank):\n'
       "        nxt('F', 1); nxt('F', 0)\n"
       '    for _ in range(p - rank):\n'
       "        nxt('F', 1); nxt('B', 1); nxt('W', 1)\n"
       "    while n.get(('F', 0), 0) < m or n.get(('F', 1), 0) < n.get(('F', 0), 0):\n"
       "        if n.get(('F', 0), 0) < m:\n"
       "            nxt('F', 0)\n"
       '        STEADY\n'
       '    for _ in range(rank):\n'
       "        nxt('B', 0); nxt('B', 1)\n"
       '    for _ in range(p - rank):\n'
       "        nxt('B', 0); nxt('W', 0)\n"
       '    for c in (1, 0):\n'
       "        for _ in range(n.get(('B', c), 0) - n.get(('W', c), 0)):\n"
       "            nxt('W', c)\n"
       '    return [a for a in out if a[1] < m]\n')
ZBV_STEADY = "nxt('B', 0); nxt('W', 0); nxt('F', 1); nxt('B', 1); nxt('W', 1)"
ZBV_STEADY_CHUNK_1_FIRST = "nxt('F', 1); nxt('B', 1); nxt('W', 1); nxt('B', 0); nxt('W', 0)"


# exercise 23: ZeRO-3's forward as the lesson's hints say: POST fills a unit's buffer and posts its gather,
# PREFETCH posts the next unit's, FREE drops the views and the buffer; the wrong answers change one of them
ZERO3 = ("import numpy as np\ndef zero3_forward(units, layers, x, comm):\n    p, r = comm.size, comm.rank\n"
         "    flight = {}\n    def post(i):\n        u = units[i]\n        k = len(u.shard)\n"
         "        POST\n        flight[i] = (full, comm.iall_gather_(full))\n    post(0)\n"
         "    for i, u in enumerate(units):\n        full, req = flight.pop(i)\n        req.wait()\n"
         "        PREFETCH\n        for prm, a, b in u.segments:\n            prm.data = full[a:b].reshape(prm.data.shape)\n"
         "        x = layers[i](x)\n        FREE\n    return x\n")
ZERO3_POST = "full = np.empty(p * k)\n        full[r * k:(r + 1) * k] = u.shard"
ZERO3_PREFETCH = "if i + 1 < len(units):\n            post(i + 1)"
ZERO3_FREE = "for prm, a, b in u.segments:\n            prm.data = None\n        full = None"


def _zero3(post=ZERO3_POST, prefetch=ZERO3_PREFETCH, free=ZERO3_FREE):
    return ZERO3.replace("POST", post).replace("PREFETCH", prefetch).replace("FREE", free)


# exercise 27: QK-norm's input gradient with rstd and xhat per row, as the template's docstring defines them;
# the wrong answers change dx (or drop eps)
QK_NORM = ("import numpy as np\ndef qk_norm_dx(dy, x, g, eps=1e-6):\n"
           "    rstd = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)\n    xhat = x * rstd\n"
           "    return {dx}\n")
QK_NORM_DX = "rstd * (dy * g - xhat * np.mean(dy * g * xhat, axis=-1, keepdims=True))"


# exercise 29: causal attention block by block as the template's docstring defines it, each block's queries
# against the first n keys, masked where key j is after query a + i; the wrong answers change n, the mask
# or the scale
BLOCKS = ("import numpy as np\ndef causal_blocks_forward(q, k, v, block):\n"
          "    T, HS = q.shape[-2:]\n    o, ps = np.empty_like(q), []\n    for a in range(0, T, block):\n"
          "        z = min(a + block, T)\n        n = {keys}\n"
          "        s = q[:, :, a:z] @ k[:, :, :n].swapaxes(-1, -2) * {scale}\n        s += {mask}\n"
          "        p = np.exp(s - s.max(axis=-1, keepdims=True))\n        p /= p.sum(axis=-1, keepdims=True)\n"
          "        o[:, :, a:z] = p @ v[:, :, :n]\n        ps.append(p)\n    return o, ps\n")
BLOCKS_RIGHT = dict(keys="z", scale="(1 / np.sqrt(HS))", mask="np.triu(np.full((z - a, n), -np.inf), a + 1)")


def _blocks(**change):
    return BLOCKS.format(**{**BLOCKS_RIGHT, **change})


WRONG = {   # exercise: wrong-but-plausible answers, each a whole exercise file
    1: [  # the right pattern of messages, zeros in them, and the sum taken from the inputs
        RING_START + "    for s in range(2 * (p - 1)):\n        for r in range(p):\n"
        "            send(r, (r + 1) % p, np.zeros(len(xs[0]) // p))\n    return [sum(xs) for _ in xs]\n",
        # every message to rank 0
        RING_START + "    s = sum(xs)\n    for r in range(p):\n        send(r, 0, s)\n    return [s.copy() for _ in xs]\n",
        # the reduce-scatter only, then the sum copied from the inputs
        RING_START + "    c = [list(x.copy().reshape(p, -1)) for x in xs]\n    for s in range(p - 1):\n"
        "        out = [(r, (r - s) % p, c[r][(r - s) % p].copy()) for r in range(p)]\n"
        "        for r, k, d in out:\n            send(r, (r + 1) % p, d)\n            c[(r + 1) % p][k] = c[(r + 1) % p][k] + d\n"
        "    return [sum(xs) for _ in xs]\n",
        # whole arrays round the ring instead of chunks
        RING_START + "    acc = [x.copy() for x in xs]\n    for s in range(p - 1):\n        for r in range(p):\n"
        "            send(r, (r + 1) % p, xs[(r - s) % p])\n            acc[(r + 1) % p] += xs[(r - s) % p]\n"
        "    return acc\n"],
    2: ["def column_parallel_backward(x, w, dy):\n    x2, d2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])\n"
        "    return dy @ w.T, d2.T @ x2, d2.sum(axis=0)\n",                      # dW transposed
        "def column_parallel_backward(x, w, dy):\n    x2, d2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])\n"
        "    return dy @ w.T, x2.T @ d2, d2.sum(axis=0) / len(d2)\n",           # db averaged
        "def column_parallel_backward(x, w, dy):\n    x2, d2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])\n"
        "    return (dy @ w.T) / 2, x2.T @ d2, d2.sum(axis=0)\n"],                # dx 'averaged' over tp
    3: ["def row_parallel_forward(xs, ws, b):\n    t = sum(x @ w + b for x, w in zip(xs, ws))\n    return [t for _ in xs]\n",
        "def row_parallel_forward(xs, ws, b):\n    return [x @ w + b for x, w in zip(xs, ws)]\n",          # no all-reduce
        "def row_parallel_forward(xs, ws, b):\n    t = sum(x @ w for x, w in zip(xs, ws)) / len(xs)\n"
        "    return [t + b for _ in xs]\n"],                                                           # mean, not sum
    4: ["ANSWER = 5.0\n", "ANSWER = 20.0\n", "ANSWER = 8.0\n", "ANSWER = '10 MiB'\n"],
    5: ["ANSWER = (16, 16)\n", "ANSWER = (28, 28)\n", "ANSWER = (16, 19)\n", "ANSWER = 16 / 28\n"],
    6: ["def one_f_one_b(stage, stages, m):\n    return [('F', i) for i in range(m)] + [('B', i) for i in range(m)]\n",
        "def one_f_one_b(stage, stages, m):\n    w = min(stages - stage, m)\n    a = [('F', i) for i in range(w)]\n"
        "    for i in range(m - w):\n        a += [('F', w + i), ('B', i)]\n    return a + [('B', i) for i in range(m - w, m)]\n",
        "def one_f_one_b(stage, stages, m):\n    w = min(stage, m)\n    a = [('F', i) for i in range(w)]\n"
        "    for i in range(m - w):\n        a += [('F', w + i), ('B', i)]\n    return a + [('B', i) for i in range(m - w, m)]\n"],
    7: ["def zero1_shard(numel, dp, rank):\n    k = numel // dp\n    return rank * k, (rank + 1) * k\n",
        "def zero1_shard(numel, dp, rank):\n    k = numel // dp\n    return rank * k, numel if rank == dp - 1 else (rank + 1) * k\n",
        "def zero1_shard(numel, dp, rank):\n    k = -(-numel // dp)\n    return min(rank * k, numel), min((rank + 1) * k, numel)\n",
        "def zero1_shard(numel, dp, rank):\n    return rank, numel\n"],
    8: ["def coords(rank, tp, pp, dp):\n    return rank % tp, (rank // tp) % dp, rank // (tp * dp)\n",
        "def coords(rank, tp, pp, dp):\n    return rank % tp, (rank // tp) % pp, rank // (tp * pp)\n",
        "def coords(rank, tp, pp, dp):\n    return rank // (pp * dp), (rank // dp) % pp, rank % dp\n"],
    9: ["ANSWER = 0\n", "ANSWER = 12\n", "ANSWER = 8\n", "ANSWER = 1\n"],
    10: ["import numpy as np\ndef reshard(pieces, dim, new_parts, groups=1):\n    return pieces\n",
         "import numpy as np\ndef reshard(pieces, dim, new_parts, groups=1):\n"
         "    return np.split(np.concatenate(pieces, axis=dim), new_parts, axis=dim)\n",                 # fused QKV cut as one
         "import numpy as np\ndef reshard(pieces, dim, new_parts, groups=1):\n"
         "    return np.split(np.concatenate(pieces, axis=1 - dim), new_parts, axis=1 - dim)\n"],
    11: ["def bubble(spans):\n    return 0.0\n",
         "def bubble(spans):\n    busy = sum(b - a for r in spans for a, b in r)\n"
         "    return 1 - busy / sum(r[-1][1] - r[0][0] for r in spans)\n",                             # each rank's own span
         "def bubble(spans):\n    busy = sum(b - a for r in spans for a, b in r)\n    end = max(b for r in spans for _, b in r)\n"
         "    return 1 - busy / (len(spans) * end)\n"],                                                 # makespan from 0
    12: ["def hidden_share(comm, compute):\n    c = sum(b - a for a, b in comm)\n"
         "    return sum(max(0, min(b, d) - max(a, e)) for a, b in comm for e, d in compute) / c\n",
         "def u(iv):\n    t, end = 0.0, float('-inf')\n    for a, b in sorted(iv):\n        if b > end:\n"
         "            t += b - max(a, end)\n            end = b\n    return t\n"
         "def hidden_share(comm, compute):\n    s = sum(u([(max(a, e), min(b, d)) for e, d in compute if min(b, d) > max(a, e)])\n"
         "            for a, b in comm)\n    return s / sum(b - a for a, b in comm)\n",                # comm summed, not united
         "def hidden_share(comm, compute):\n    c = sum(b - a for a, b in comm)\n    return min(1.0, sum(b - a for a, b in compute) / c)\n"],
    13: [MPI_RING + "    return comm.all_reduce(x)\n",                                                  # a collective
         MPI_RING + "    for s in range(p - 1):\n        k = (r - s) % p\n"                             # reduce-scatter only
         "        wait_all([comm.irecv_(buf, (r - 1) % p), comm.isend(c[k], (r + 1) % p)])\n"
         "        c[(k - 1) % p] += buf\n    return x\n",
         MPI_RING + "    for s in range(2 * (p - 1)):\n"                                             # whole arrays round
         "        out = x.copy()\n        big = np.empty_like(x)\n"
         "        wait_all([comm.irecv_(big, (r - 1) % p), comm.isend(out, (r + 1) % p)])\n    return x\n",
         MPI_RING + "    for s in range(p - 1):\n        k = (r - s) % p\n"                             # blocking: hangs
         "        comm.send(c[k], (r + 1) % p)\n        comm.recv_(buf, (r - 1) % p)\n        c[(k - 1) % p] += buf\n"
         "    for s in range(p - 1):\n        k = (r + 1 - s) % p\n        comm.send(c[k], (r + 1) % p)\n"
         "        comm.recv_(buf, (r - 1) % p)\n        c[(k - 1) % p] = buf\n    return x\n"],
    14: [_program(NAIVE),                                                                              # as given
         _program([GOOD[0], [w for w in GOOD[1] if w != "sendB3>0"]]),                                  # a message left out
         _program([["sendF0>1", "F0"] + GOOD[0][2:], GOOD[1]]),                                          # sent before made
         _program([GOOD[0], ["recvF0<0", "recvF1<0", "F0", "F1", "B0", "sendB0>0", "B1", "sendB1>0"] + GOOD[1][9:]]),
         _program([GOOD[0], [w.replace("sendB0>0", "sendB1>0") if w == "sendB0>0" else w for w in GOOD[1]]])],
    15: [TP_MLP.format(forward="    y = h @ w2 + b2", backward="    dx = (dh * (1 - h * h)) @ w1.T"),     # as given
         TP_MLP.format(forward="    y = comm.all_reduce(h @ w2 + b2)",                                  # b2 on every rank
                       backward="    dx = comm.all_reduce((dh * (1 - h * h)) @ w1.T)"),
         TP_MLP.format(forward="    y = comm.all_reduce(h @ w2) + b2",                                  # forward only
                       backward="    dx = (dh * (1 - h * h)) @ w1.T"),
         TP_MLP.format(forward="    y = comm.all_reduce(h @ w2) + b2\n    dy = comm.all_reduce(dy)",    # one too many
                       backward="    dx = comm.all_reduce((dh * (1 - h * h)) @ w1.T) / 2")],
    16: ["import numpy as np\ndef merge(o1, l1, o2, l2):\n    l = np.log(np.exp(l1) + np.exp(l2))\n"
         "    return np.exp(l1 - l)[..., None] * o1 + np.exp(l2 - l)[..., None] * o2, l\n",              # overflows
         "import numpy as np\ndef merge(o1, l1, o2, l2):\n    l = np.logaddexp(l1, l2)\n"
         "    return np.exp(l1 - l)[..., None] * o1 + np.exp(l2 - l)[..., None] * o2, l\n",              # nan when both -inf
         "import numpy as np\ndef merge(o1, l1, o2, l2):\n    return (o1 + o2) / 2, np.logaddexp(l1, l2)\n",
         "import numpy as np\ndef merge(o1, l1, o2, l2):\n    l = np.maximum(l1, l2)\n"
         "    s = np.where(np.isfinite(l), l, 0)\n"
         "    return np.exp(l1 - s)[..., None] * o1 + np.exp(l2 - s)[..., None] * o2, l\n"],              # max for the sum
    17: ["def kv_positions(rank, step, cp, seq_len):\n    j = (rank + step) % cp\n    c = seq_len // (2 * cp)\n"
         "    return list(range(j * c, (j + 1) * c)) + list(range((2 * cp - 1 - j) * c, (2 * cp - j) * c))\n",
         "def kv_positions(rank, step, cp, seq_len):\n    j = (rank - step) % cp\n    n = seq_len // cp\n"
         "    return list(range(j * n, (j + 1) * n))\n",                                               # no causal balance
         "def kv_positions(rank, step, cp, seq_len):\n    j = (rank - step) % cp\n    c = seq_len // (2 * cp)\n"
         "    return list(range((2 * cp - 1 - j) * c, (2 * cp - j) * c)) + list(range(j * c, (j + 1) * c))\n"],
    18: ["import numpy as np\ndef rh(x):\n    h = x.shape[-1] // 2\n    return np.concatenate([-x[..., h:], x[..., :h]], -1)\n"
         "def rope_backward(dy, cos, sin):\n    return dy * cos + rh(dy * sin)\n",                         # R^T taken as R
         "import numpy as np\ndef rh(x):\n    h = x.shape[-1] // 2\n    return np.concatenate([-x[..., h:], x[..., :h]], -1)\n"
         "def rope_backward(dy, cos, sin):\n    return dy * sin - rh(dy * cos)\n",                          # tables swapped
         "import numpy as np\ndef rope_backward(dy, cos, sin):\n    return dy * cos\n"],
    19: ["def kv_heads(n_head, n_kv_head, tp, rank):\n    q = n_head // tp\n    return [i // (n_head // n_kv_head) for i in range(q)]\n",
         "def kv_heads(n_head, n_kv_head, tp, rank):\n    q = n_head // tp\n"
         "    return [(rank * q + i) % n_kv_head for i in range(q)]\n",                                 # interleaved groups
         "def kv_heads(n_head, n_kv_head, tp, rank):\n    q = n_head // tp\n"
         "    return [(rank * q + i) // n_kv_head for i in range(q)]\n"],
    20: ["def next_scale(scale, good, finite, n):\n    if not finite:\n        return scale / 2, good, False\n"
         "    good += 1\n    return (scale * 2, 0, True) if good == n else (scale, good, True)\n",       # count not reset
         "def next_scale(scale, good, finite, n):\n    if not finite:\n        return scale / 2, 0, True\n"
         "    good += 1\n    return (scale * 2, 0, True) if good == n else (scale, good, True)\n",       # applies the inf step
         "def next_scale(scale, good, finite, n):\n    if not finite:\n        return scale / 2, 0, False\n"
         "    good += 1\n    return (scale * 2, good, True) if good % n == 0 else (scale, good, True)\n",
         "def next_scale(scale, good, finite, n):\n    if not finite:\n        return scale / 2, 0, False\n"
         "    return (scale * 2, 0, True) if good == n else (scale, good + 1, True)\n"],                # grows one late
    21: ["def hang_diagnosis(records, world):\n    missing = [r for r in range(world) if r not in records]\n"
         "    waits = {r: (o['group'], o['op'], o['seq'] if o['peer'] is None else o['peer'])\n"
         "             for r, rec in records.items() for o in rec.get('ops', [])[-1:] if o['end'] is None}\n"
         "    return missing, waits\n",                                                                 # last op, dead ignored
         "def hang_diagnosis(records, world):\n    culprits = [r for r in range(world) if r not in records or records[r].get('dead')]\n"
         "    waits = {}\n    for r, rec in records.items():\n"
         "        ops = [o for o in rec.get('ops', []) if o['end'] is None]\n        if ops and not rec.get('dead'):\n"
         "            o = ops[0]\n            waits[r] = (o['group'], o['op'], o['seq'] if o['peer'] is None else o['peer'])\n"
         "    return culprits, waits\n",                                                                # counts posted ops
         "def hang_diagnosis(records, world):\n    waits = {}\n    for r, rec in records.items():\n"
         "        ops = [o for o in rec.get('ops', []) if o['end'] is None and o['wait'] is not None]\n"
         "        if ops and not rec.get('dead'):\n            o = ops[0]\n"
         "            waits[r] = (o['group'], o['op'], o['seq'] if o['peer'] is None else o['peer'])\n"
         "    return [r for r in range(world) if r not in waits], waits\n"],                          # idle = culprit
    22: ["ANSWER = (1024, 2048, (1, 2, 2))\n", "ANSWER = (0, 3072, (1, 2, 2))\n", "ANSWER = (1024, 3072, (1, 1, 2))\n",
         "ANSWER = (1024, 3072, (1, 2, 3))\n"],
    23: [_zero3(free="full = None"),                                                           # the views kept
         _zero3(free="u.full = full\n        for prm, a, b in u.segments:\n            prm.data = None\n"
                     "        full = None"),                                                   # kept on the unit
         _zero3(post="full = np.empty(p * k)\n        full[:k] = u.shard"),                    # own slice first
         _zero3(post="full = np.empty(u.segments[-1][2])\n        full[r * k:(r + 1) * k] = u.shard"),  # no padding
         _zero3(post="n = u.segments[-1][2]\n        full = np.zeros(p * k)\n"
                     "        full[r * (n // p):r * (n // p) + k] = u.shard"),                   # unpadded slices
         _zero3(prefetch="pass"),                                                               # no prefetch
         _zero3(prefetch=ZERO3_PREFETCH + "\n            flight[i + 1][1].wait()")],                 # waited at once
    24: [ZBV.replace("WARM", "2 * (p - rank) - 2").replace("STEADY", ZBV_STEADY),  # warm-up one short: a hang
         ZBV.replace("WARM", "2 * (p - rank) - 1").replace("STEADY", ZBV_STEADY_CHUNK_1_FIRST),  # one activation more
         ZBV.replace("WARM", "2 * (p - rank)").replace("STEADY", ZBV_STEADY),  # warm-up one too long: idles
         ZBV.replace("WARM", "2 * (p - rank) - 1").replace("STEADY", ZBV_STEADY)
         .replace("nxt('B', 0); nxt('B', 1)\n", "nxt('B', 0); nxt('W', 0); nxt('B', 1); nxt('W', 1)\n")],  # no W kept back
    25: ["import numpy as np\n\ndef dispatch_combine(idx, w, n_expert, ep, ye):\n    N, k = idx.shape\n    flat = idx.reshape(-1)\n    order = np.argsort(flat, kind='stable')\n"
         "    send = np.bincount(flat, minlength=n_expert)\n    y = np.zeros((N, ye.shape[1]))\n"
         "    np.add.at(y, order // k, ye * w.reshape(-1)[order, None])\n    return order, send, y\n",   # counts per expert
         "import numpy as np\n\ndef dispatch_combine(idx, w, n_expert, ep, ye):\n    N, k = idx.shape\n    flat = idx.reshape(-1)\n    order = np.argsort(flat, kind='stable')\n"
         "    send = np.bincount(flat % ep, minlength=ep)\n    y = np.zeros((N, ye.shape[1]))\n"
         "    np.add.at(y, order // k, ye * w.reshape(-1)[order, None])\n    return order, send, y\n",   # round-robin experts
         "import numpy as np\n\ndef dispatch_combine(idx, w, n_expert, ep, ye):\n    N, k = idx.shape\n    flat = idx.reshape(-1)\n    order = np.argsort(flat, kind='stable')\n"
         "    send = np.bincount(flat, minlength=n_expert).reshape(ep, -1).sum(axis=1)\n"
         "    y = np.zeros((N, ye.shape[1]))\n    np.add.at(y, order // k, ye)\n    return order, send, y\n",  # no weights
         "import numpy as np\n\ndef dispatch_combine(idx, w, n_expert, ep, ye):\n    N, k = idx.shape\n    flat = idx.reshape(-1)\n    order = np.argsort(flat, kind='stable')\n"
         "    send = np.bincount(flat, minlength=n_expert).reshape(ep, -1).sum(axis=1)\n"
         "    y = np.zeros((N, ye.shape[1]))\n    np.add.at(y, order % N, ye * w.reshape(-1)[order, None])\n"
         "    return order, send, y\n"],                                                                # wrong token
    26: ["import numpy as np\n\ndef seq_to_heads(parts, positions):\n    p = len(parts)\n    h = parts[0].shape[1] // p\n"
         "    return [np.concatenate([x[:, j * h:(j + 1) * h] for x in parts], axis=2) for j in range(p)]\n",   # rank order
         "import numpy as np\n\ndef seq_to_heads(parts, positions):\n    p, order = len(parts), np.concatenate(positions)\n"
         "    out = []\n    for j in range(p):\n        y = np.concatenate([x[:, j::p] for x in parts], axis=2)\n"
         "        z = np.empty_like(y)\n        z[:, :, order] = y\n        out.append(z)\n    return out\n",  # strided heads
         "import numpy as np\n\ndef seq_to_heads(parts, positions):\n    order = np.concatenate(positions)\n"
         "    y = np.concatenate(parts, axis=2)\n    z = np.empty_like(y)\n    z[:, :, order] = y\n"
         "    return [z for _ in parts]\n"],                                                           # no head cut
    27: [QK_NORM.format(dx="rstd * g * dy"),                                                    # rstd held constant
         QK_NORM.format(dx="rstd * (dy * g - xhat * np.mean(dy * g * xhat))"),                 # one mean for all rows
         QK_NORM.format(dx="rstd * (dy - xhat * np.mean(dy * xhat, axis=-1, keepdims=True))"),  # the gain left out
         QK_NORM.format(dx="rstd * (dy * g - xhat * np.sum(dy * g * xhat, axis=-1, keepdims=True))"),  # sum, not mean
         QK_NORM.replace(" + eps", "").format(dx=QK_NORM_DX)],                                  # eps left out
    28: ["ANSWER = (1048576, 524288)\n",             # rows that leave the rank only, (ep - 1) / ep of them
         "ANSWER = (1048576, 1048576)\n",            # the forward's two all-to-alls only
         "ANSWER = (4194304, 4194304)\n",            # the whole batch's tokens on every rank
         "ANSWER = (2097152, 1048576)\n",            # halved again at ep 4
         "ANSWER = 2097152\n"],
    29: [_blocks(keys="T"),                                          # every key: the whole square, in strips
         _blocks(keys="z - 1"),                                      # the last query's own key left out
         _blocks(mask="0"),                                          # no mask on the diagonal square
         _blocks(mask="np.triu(np.full((z - a, n), -np.inf), 1)"),   # the mask not moved to the block's diagonal
         _blocks(scale="(1 / HS)")],                                 # 1 / HS, not 1 / sqrt(HS)
}


def _verdict(tmp_path, number, code, timeout=60):
    path = tmp_path / f"ex{number:02d}.py"
    path.write_text(code)
    return verdict(BY_NUMBER[number], load(path), path, timeout)


def test_at_least_eighteen_exercises_three_of_them_under_mpiexec():
    # numbered in the order they joined, each once
    numbers = [e.number for e in EXERCISES]
    assert len(EXERCISES) >= 18 and numbers == list(range(1, len(EXERCISES) + 1))
    assert len([e for e in EXERCISES if e.ranks]) >= 3 and all(e.ranks in (2, 4) for e in EXERCISES if e.ranks)
    assert all(len(WRONG[e.number]) >= 3 for e in EXERCISES)
    assert all(len(e.hints) >= 3 for e in EXERCISES)


@pytest.mark.parametrize("exercise", EXERCISES, ids=IDS)
def test_blank_template_fails_and_the_reference_passes(exercise, tmp_path):
    path = tmp_path / exercise.filename()
    shutil.copyfile(exercise.template, path)
    ok, message = verdict(exercise, load(path), path)
    assert not ok and f"exercise {exercise.number}" in message
    if exercise.name == "ANSWER":
        assert "ANSWER is still None" in message and str(path) in message
    elif exercise.number in (14, 15):             # given as the code that hangs, or runs without all-reduces
        assert "not yet" in message, message
    else:
        assert "NotImplementedError" in message and str(path) in message
    ok, message = verdict(exercise, reference(exercise), "reference")
    assert ok, message


CASES = [(n, i) for n in sorted(WRONG) for i in range(len(WRONG[n]))]


@pytest.mark.parametrize("number,i", CASES, ids=[f"ex{n:02d}-{i}" for n, i in CASES])
def test_every_known_wrong_answer_fails(number, i, tmp_path):
    ok, message = _verdict(tmp_path, number, WRONG[number][i], timeout=20)
    assert not ok and "not yet" in message, message
    exercise = BY_NUMBER[number]
    if exercise.name == "ANSWER":          # a failed prediction never prints the measured answer
        answer = exercise.solution()
        numbers = answer if isinstance(answer, tuple) else (answer,)
        flat = [n for v in numbers for n in (v if isinstance(v, tuple) else (v,))]
        shown = message.split(" - ", 1)[1]
        assert not any(re.search(rf"(?<![\d.]){re.escape(f'{n:g}')}(?![\d.])", shown) for n in flat
                       if f"{n:g}" not in exercise.title + WRONG[number][i]), message
        assert exercise.after.split()[0] not in shown


def test_messages_point_at_the_first_difference(tmp_path):
    ok, message = _verdict(tmp_path, 6, WRONG[6][0])
    assert "p=4, m=8, stage 0: the first 4 actions are right; action 5 is ('F', 4), 1F1B runs ('B', 0) there" \
        in message, message
    ok, message = _verdict(tmp_path, 1, WRONG[1][0])
    assert "message 1 (rank 0 -> 1) is not the sum of one chunk" in message


def test_qk_norm_written_as_the_hints_say_passes_and_a_constant_rstd_is_named(tmp_path):
    ok, message = _verdict(tmp_path, 27, QK_NORM.format(dx=QK_NORM_DX))
    assert ok, message
    ok, message = _verdict(tmp_path, 27, WRONG[27][0])
    assert "rstd is held constant" in message and "\n" not in message.split("\n  (a hint")[0], message
    ok, message = _verdict(tmp_path, 27, WRONG[27][1])       # one line, naming the first wrong element
    assert re.search(r"queries of shape \(B, heads, T, HS\) = \(2, 4, 3, 8\): dx\[0, 0, 0, \d+\] is \S+, "
                     r"expected \S+$", message.split("\n")[0]), message


def test_qk_norm_check_catches_what_only_the_finite_differences_see(tmp_path):
    # right on every shape the element-wise part shows, wrong on the new point: only the slope catches it
    code = QK_NORM.format(dx=QK_NORM_DX + " if x.shape != (2, 3, 4, 6) else 1.01 * (" + QK_NORM_DX + ")")
    ok, message = _verdict(tmp_path, 27, code)
    assert not ok and "central differences" in message, message


def test_causal_blocks_written_as_the_template_says_pass_and_the_whole_square_is_named(tmp_path):
    ok, message = _verdict(tmp_path, 29, _blocks())
    assert ok, message
    ok, message = _verdict(tmp_path, 29, WRONG[29][0])
    assert "block [0, 4)'s P has shape (2, 3, 4, 12), expected (2, 3, 4, 4) - it has keys after its last query" \
        in message, message
    ok, message = _verdict(tmp_path, 29, WRONG[29][2])       # the first wrong P: a key after its query
    assert re.search(r"block \[0, 4\)'s P\[0, 0, query 0, key 1\] \(a key after the query: P is 0 there\) is "
                     r"\S+, expected 0 ", message), message


def test_ep_bytes_with_the_counts_pass_and_are_the_rows_of_the_run():
    from hpcpar.course.check_a2a import check_ep_rows_bytes, ep_rows_bytes
    rows = 16 // 4 * 64 * 2                     # batch over dp 4, sequence 64, top-2: the rank's rows
    assert ep_rows_bytes() == (4 * 2 * rows * 64 * 8,) * 2       # 4 all-to-alls a layer, 2 layers, float64
    check_ep_rows_bytes(tuple(b + 2 * 4 * 8 for b in ep_rows_bytes()))      # the counts too: within 1 %


def test_a_fixed_pipeline_program_runs_on_two_ranks(tmp_path):
    fixed = [GOOD[0], ["recvF0<0", "F0", "B0", "recvF1<0", "sendB0>0"] + GOOD[1][5:]]
    ok, message = _verdict(tmp_path, 14, _program(fixed))
    assert ok, message


def test_a_crash_in_the_students_code_names_its_line(tmp_path):
    ok, message = _verdict(tmp_path, 8, "def coords(rank, tp, pp, dp):\n    return 1 / 0\n")
    assert not ok and "ZeroDivisionError" in message and "line 2" in message


def test_a_crash_on_an_mpi_rank_names_the_rank_and_the_line(tmp_path):
    code = "def tp_mlp(comm, x, w1, b1, w2, b2, dy):\n    y = 1 / comm.rank\n    return comm.all_reduce(x), x\n"
    ok, message = _verdict(tmp_path, 15, code)
    assert not ok and "ZeroDivisionError" in message and "line 2" in message and "on rank 0" in message


def test_hints_come_one_at_a_time(tmp_path):
    exercise = BY_NUMBER[16]
    shown = [next_hint(exercise, tmp_path) for _ in range(len(exercise.hints) + 1)]
    assert [s.split(":")[0] for s in shown] == [f"hint {k} of 3" for k in (1, 2, 3, 3)]
    assert "--hint again" in shown[0] and "--hint again" not in shown[2]


def test_the_references_agree_with_the_engine():
    assert check_pp.one_f_one_b(0, 4, 8)[:5] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0)]
    assert check_pp.busy_of_total() == (16, 28)
    from hpcpar.watch.why import diagnose
    for what, records in check_hangs.cases():     # the culprits are the ones `hpcpar trace why` names first
        culprits, _ = check_hangs.hang_diagnosis(records, 8)
        text = diagnose(records, world=8)
        assert text.startswith(f"rank {culprits[0]} (") if culprits else text.startswith("every rank waits"), what


def test_ring_allreduce_reference_matches_the_sum():
    from hpcpar.course.collectives import ring_allreduce
    xs = [np.arange(12.0) * (r + 1) for r in range(3)]
    sent = []
    out = ring_allreduce(xs, lambda s, d, c: sent.append((s, d)))
    assert all(np.array_equal(y, sum(xs)) for y in out) and len(sent) == 12


def test_cli_start_then_check(tmp_path):
    hpcpar = [sys.executable, "-m", "hpcpar", "course"]
    proc, _ = run(hpcpar + ["start", "5", "6", "7", "--dir", str(tmp_path)], timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and all(f"ex0{n}.py" in proc.stdout for n in (5, 6, 7))
    assert f"{sys.executable} -m hpcpar course check 7 --dir" in proc.stdout or \
        str(Path(sys.executable).parent / "hpcpar") in proc.stdout       # a command that works from anywhere
    proc, _ = run(hpcpar + ["check", "7", "--dir", str(tmp_path)], timeout=60)
    assert proc.returncode == 1 and "not written yet" in proc.stdout
    (tmp_path / "ex07.py").write_text("def zero1_shard(numel, dp, rank):\n    k = -(-numel // dp)\n"
                                      "    return rank * k, (rank + 1) * k\n")
    proc, _ = run(hpcpar + ["check", "7", "--dir", str(tmp_path)], timeout=60)
    assert proc.returncode == 0 and "passed" in proc.stdout
    (tmp_path / "ex05.py").write_text("ANSWER = (16, 16)\n")
    proc, _ = run(hpcpar + ["check", "5", "--hint", "--dir", str(tmp_path)], timeout=60)
    assert proc.returncode == 1 and "not yet" in proc.stdout and "hint 1 of 3" in proc.stdout
    assert "schedule" not in proc.stdout                 # the measuring command comes with a passed check only
    proc, _ = run(hpcpar + ["check", "99"], timeout=60)
    assert proc.returncode == 2 and "no exercise" in proc.stderr
    proc, _ = run(hpcpar + ["check", "3", "--dir", str(tmp_path)], timeout=60)
    assert proc.returncode == 2 and "course start 3" in proc.stderr


# --- the lessons ---------------------------------------------------------------------------------------

def _headings(page):
    return {line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")}


def test_every_lesson_reference_resolves():
    lessons = sorted(COURSE.glob("[0-9][0-9]-*.md"))
    assert {e.lesson for e in EXERCISES} <= {p.name for p in lessons}
    for page in lessons + [COURSE / "README.md"]:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]+\.md)", text):             # markdown links
            assert (page.parent / target).exists(), f"{page.name}: link {target}"
        text = " ".join(text.split())                                     # references that wrap a line
        named = re.findall(r"docs/([\w/]+\.md) (?:up to|from) \"([^\"]+)\"", text) + \
            [(doc, heading) for heading, doc in re.findall(r"\"([^\"]+)\" (?:of|in) docs/([\w/]+\.md)", text)]
        for doc, heading in named:
            assert (DOCS / doc).exists(), f"{page.name}: {doc}"
            assert heading in _headings(DOCS / doc), f"{page.name}: {doc} has no heading {heading!r}"
        assert "The traffic per layer" not in text
        for doc in re.findall(r"docs/([\w/]+\.md)", text):
            assert (DOCS / doc).exists(), f"{page.name}: {doc}"
        for number in re.findall(r"\*\*Exercise (\d+)", text):
            assert BY_NUMBER[int(number)].lesson == page.name, f"{page.name}: exercise {number}"
        for path in re.findall(r"hpcpar/[\w/]+\.py", text):
            assert (DOCS.parent / path).exists(), f"{page.name}: {path}"


@pytest.mark.parametrize("exercise", [e for e in EXERCISES if e.name == "ANSWER"], ids=lambda e: f"ex{e.number:02d}")
def test_no_lesson_prints_the_answer_to_its_own_prediction(exercise):
    text = (COURSE / exercise.lesson).read_text()
    measure = exercise.after.split(": ", 1)[1].split(";")[0].split(" compares")[0]
    assert measure.split(" --")[0] not in text or measure not in text, f"{exercise.lesson} runs {measure}"
    answer = exercise.solution()
    flat = [n for v in (answer if isinstance(answer, tuple) else (answer,)) for n in (v if isinstance(v, tuple) else (v,))]
    for n in flat:
        if n > 4:          # small numbers (the 2 of tp 2) are everywhere; the answers' own numbers are not
            assert not re.search(rf"(?<![\w.]){re.escape(f'{n:g}')}(?![\w.])", text), f"{exercise.lesson} prints {n:g}"
