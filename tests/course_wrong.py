"""The wrong-but-plausible answers tests/test_course.py feeds every check: at least four an exercise,
each a whole exercise file, with what makes it wrong beside it.  Among them the eight classes a
student's run of the course found passing in an earlier round (ex 13's direct exchange, unwaited
sends and hard-coded range(3); ex 15's "- b2"; ex 20's "scale // 2"; ex 23's float64 gather buffer;
ex 24's Ws deferred to the end; ex 10's axis=-1).  HANG holds the answers that deadlock (their job
is ended by the timeout), one launch each; the MPI exercises' others run in one job per exercise."""
from pathlib import Path

from hpcpar.course import check_pp

SOLUTIONS = Path(__file__).resolve().parent.parent / "hpcpar" / "course" / "solutions"

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
         ],
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

# the blocking ring: every rank sits in a 1 MB send that waits for a receive nobody has posted
HANG = {13: MPI_RING + "    for s in range(p - 1):\n        k = (r - s) % p\n"
            "        comm.send(c[k], (r + 1) % p)\n        comm.recv_(buf, (r - 1) % p)\n        c[(k - 1) % p] += buf\n"
            "    for s in range(p - 1):\n        k = (r + 1 - s) % p\n        comm.send(c[k], (r + 1) % p)\n"
            "        comm.recv_(buf, (r - 1) % p)\n        c[(k - 1) % p] = buf\n    return x\n"}

# exercise 13: the ring written right, with one thing changed (RING_STEP: one step's exchange)
RING13 = (MPI_RING + "    for phase in ('rs', 'ag'):\n        for s in range(STEPS):\n"
          "            shift = s if phase == 'rs' else s - 1\n            out, into = (r - shift) % p, (r - shift - 1) % p\n"
          "            RING_STEP\n            if phase == 'rs':\n                c[into] += buf\n"
          "            else:\n                c[into] = buf\n    return x\n")
RING13_STEP = "wait_all([comm.irecv_(buf, (r - 1) % p), comm.isend(c[out], (r + 1) % p)])"


def _ring13(steps="p - 1", step=RING13_STEP):
    return RING13.replace("STEPS", steps).replace("RING_STEP", step)


# exercise 30: the pair written right (PAIR), one function changed
PAIR = {"column_forward": "    y = x @ w\n    return y + b if b is not None else y\n",
        "column_backward": "    x2, d2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])\n"
                           "    return comm.all_reduce(dy @ w.T), x2.T @ d2, d2.sum(axis=0)\n",
        "row_forward": "    y = comm.all_reduce(x @ w)\n    return y + b if b is not None else y\n",
        "row_backward": "    x2, d2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])\n"
                        "    return dy @ w.T, x2.T @ d2, d2.sum(axis=0)\n"}
ARGS = {"column_forward": "x, w, b, comm", "column_backward": "dy, x, w, comm", "row_forward": "x, w, b, comm",
        "row_backward": "dy, x, w, comm"}


def _pair(**change):
    body = {**PAIR, **change}
    return "import numpy as np\n" + "".join(f"def {n}({ARGS[n]}):\n{body[n]}" for n in PAIR)


# exercise 31: the ring forward written right (hpcpar/course/solutions/ex31.py), one line changed
RING31 = (SOLUTIONS / "ex31.py").read_text()


def _ring31(old, new):
    assert old in RING31, old
    return RING31.replace(old, new)


# exercise 32: the all-to-alls written right (solutions/ex32.py), one line changed
EXPERTS = (SOLUTIONS / "ex32.py").read_text()


def _experts(old, new):
    assert old in EXPERTS, old
    return EXPERTS.replace(old, new)


MEASURED = ({"pp2": 120.0, "dp2": 80.0}, 0.38)        # a measurement the fast tests give the check
RIGHT33 = dict(ms_per_step={"pp2": 110.0, "dp2": 78.0}, bubble=dict(measured=0.36, simulated=1 / 3), faster="dp2",
               why="bubble")


def _answer33(**change):
    return f"ANSWER = {dict(RIGHT33, **change)!r}\n"


ADDED = {
    2: ["def column_parallel_backward(x, w, dy):\n    x2 = x.reshape(-1, x.shape[-1])\n"
        "    return dy @ w.T, x2.T @ dy.reshape(-1, dy.shape[-1]), dy.sum(axis=0)\n"],       # db summed over one axis
    3: ["def row_parallel_forward(xs, ws, b):\n    t = sum(x @ w for x, w in zip(xs, ws))\n"
        "    return [t + b if i == 0 else t for i in range(len(xs))]\n"],                   # bias on rank 0 only
    6: ["def one_f_one_b(stage, stages, m):\n    w = min(stages - stage - 1, m)\n    a = [('F', i) for i in range(w)]\n"
        "    for i in range(m - w):\n        a += [('F', w + i), ('B', i)]\n"
        "    return a + [('B', i) for i in reversed(range(m - w, m))]\n"],                    # drain in reverse
    8: ["def coords(rank, tp, pp, dp):\n    return rank % tp, rank // (tp * dp) % pp, rank // tp\n"],   # dp not wrapped
    10: ["import numpy as np\ndef reshard(pieces, dim, new_parts, groups=1):\n"                 # groups on the last axis
         "    if groups == 1:\n        return np.split(np.concatenate(pieces, axis=dim), new_parts, axis=dim)\n"
         "    g = [np.concatenate([np.split(p, groups, axis=-1)[i] for p in pieces], axis=-1) for i in range(groups)]\n"
         "    c = [np.split(x, new_parts, axis=-1) for x in g]\n"
         "    return [np.concatenate([c[i][j] for i in range(groups)], axis=-1) for j in range(new_parts)]\n"],
    11: ["def bubble(spans):\n    busy = sum(b - a for r in spans for a, b in r)\n"          # p left out
         "    return 1 - busy / (max(b for r in spans for _, b in r) - min(a for r in spans for a, _ in r))\n"],
    12: ["def m(iv):\n    out = []\n    for a, b in sorted(iv):\n        if out and a <= out[-1][1]:\n"
         "            out[-1] = (out[-1][0], max(out[-1][1], b))\n        else:\n            out.append((a, b))\n"
         "    return out\ndef hidden_share(comm, compute):\n    c = m(comm)\n"
         "    return sum(max(0, min(b, d) - max(a, e)) for a, b in c for e, d in compute) / sum(b - a for a, b in c)\n"],
    13: [  # a direct exchange: the right counts and bytes, to the chunk's owner instead of round the ring
         MPI_RING + "    reqs, got = [], np.empty((p, len(buf)))\n    for q in range(p):\n        if q != r:\n"
         "            reqs += [comm.isend(c[q], q), comm.irecv_(got[q], q)]\n    wait_all(reqs)\n"
         "    c[r] += got[[q for q in range(p) if q != r]].sum(axis=0)\n    reqs = []\n    for q in range(p):\n"
         "        if q != r:\n            reqs += [comm.isend(c[r], q), comm.irecv_(got[q], q)]\n    wait_all(reqs)\n"
         "    for q in range(p):\n        if q != r:\n            c[q] = got[q]\n    return x\n",
         _ring13(step="s_ = comm.isend(c[out], (r + 1) % p)\n            comm.irecv_(buf, (r - 1) % p).wait()"),  # sends never waited
         _ring13(steps="3")],                                                                # written for 4 ranks only
    15: [TP_MLP.format(forward="    y = comm.all_reduce(h @ w2 + b2) - b2",                 # right at tp 2 only
                       backward="    dx = comm.all_reduce((dh * (1 - h * h)) @ w1.T)")],
    17: ["def kv_positions(rank, step, cp, seq_len):\n    j = (rank - step - 1) % cp\n    c = seq_len // (2 * cp)\n"
         "    return list(range(j * c, (j + 1) * c)) + list(range((2 * cp - 1 - j) * c, (2 * cp - j) * c))\n"],
    18: ["import numpy as np\ndef rh(x):\n    h = x.shape[-1] // 2\n    return np.concatenate([-x[..., h:], x[..., :h]], -1)\n"
         "def rope_backward(dy, cos, sin):\n    t = dy * sin\n    h = t.shape[-1] // 2\n"
         "    return dy * cos + np.concatenate([t[..., h:], t[..., :h]], -1)\n"],               # halves swapped, no sign
    19: ["def kv_heads(n_head, n_kv_head, tp, rank):\n    q = n_head // tp\n"                   # the rank's local K/V index
         "    return [(rank * q + i) // (n_head // n_kv_head) % (n_kv_head // tp) for i in range(q)]\n"],
    20: ["def next_scale(scale, good, finite, n):\n    if not finite:\n        return scale // 2, 0, False\n"   # // : 0 below 1
         "    good += 1\n    return (scale * 2, 0, True) if good == n else (scale, good, True)\n"],
    21: ["def hang_diagnosis(records, world):\n    waits = {}\n    for r, rec in records.items():\n"
         "        ops = [o for o in rec.get('ops', []) if o['end'] is None and o['wait'] is not None]\n"
         "        if ops and not rec.get('dead'):\n            o = ops[0]\n"
         "            waits[r] = (o['group'], o['op'], o['seq'] if o['peer'] is None else o['peer'])\n"
         "    return [r for r in range(world) if r not in records], waits\n"],                # the dead one forgotten
    23: [_zero3(post="full = np.empty(p * k, dtype=np.float64)\n        full[r * k:(r + 1) * k] = u.shard")],  # float64
    24: [ZBV.replace("WARM", "2 * (p - rank) - 1")                                                 # every W at the end
         .replace("nxt('F', 1); nxt('B', 1); nxt('W', 1)\n", "nxt('F', 1); nxt('B', 1)\n")
         .replace("STEADY", "nxt('B', 0); nxt('F', 1); nxt('B', 1)")
         .replace("nxt('B', 0); nxt('W', 0)\n", "nxt('B', 0)\n")],
    26: ["import numpy as np\n\ndef seq_to_heads(parts, positions):\n    p = len(parts)\n    h = parts[0].shape[1] // p\n"
         "    order = np.argsort(np.concatenate(positions))\n    out = []\n    for j in range(p):\n"
         "        y = np.concatenate([x[:, j * h:(j + 1) * h] for x in parts], axis=2)\n        z = np.empty_like(y)\n"
         "        z[:, :, order] = y\n        out.append(z)\n    return out\n"],                 # the inverse permutation
    30: [_pair(column_backward=PAIR["column_backward"].replace("comm.all_reduce(dy @ w.T)", "dy @ w.T")),   # no f backward
         _pair(row_forward="    y = comm.all_reduce(x @ w + b)\n    return y\n"),                  # b on every rank
         _pair(row_forward="    return comm.all_reduce(x @ w + b) - b\n"),                        # right at tp 2 only
         _pair(column_forward="    return comm.all_reduce(x @ w) + b\n"),                          # f as a sum forward
         _pair(row_backward=PAIR["row_backward"].replace("dy @ w.T", "comm.all_reduce(dy @ w.T)"))],   # g backward summed
    31: [_ring31("positions[r], positions[src]", "positions[r], positions[r]"),              # every block at its own place
         _ring31("src = (r - step) % p", "src = (r + step) % p"),                             # the block's owner miscounted
         _ring31("requests = [comm.irecv_(incoming, (r - 1) % p), comm.isend(kv, (r + 1) % p)]",
                 "requests = [comm.irecv_(incoming, (r - 1) % p)]\n            comm.isend(kv, (r + 1) % p)"),  # send unwaited
         _ring31("            o = np.exp(lse - safe)[..., None] * o + np.exp(lse_b - safe)[..., None] * o_b",
                 "            o = (o + o_b) / 2")],                                          # a mean, not a merge
    32: [_experts("    return arrived[order], offsets, (order, send, recv)",
                  "    return arrived, offsets, (np.arange(len(arrived)), send, recv)"),       # source by source
         _experts("    back[order] = rows", "    back[:] = rows"),                              # combine not undone
         _experts("    offsets = np.concatenate([[0], np.cumsum(got.sum(axis=0))])",
                  "    offsets = np.concatenate([[0], np.cumsum(counts.reshape(p, local)[comm.rank])])"),  # own counts
         _experts("    return comm.all_to_allv(back, recv, send)", "    return back[:len(back)]")],   # never sent back
    33: [_answer33(faster="pp2"), _answer33(why="communication volume"),
         _answer33(bubble=dict(measured=0.36, simulated=33.3)),                                  # percent, not fraction
         _answer33(ms_per_step={"pp2": 78.0, "dp2": 110.0}),                                     # the two swapped
         _answer33(bubble=dict(measured=0.9, simulated=1 / 3))],
}
for _number, _codes in ADDED.items():
    WRONG.setdefault(_number, []).extend(_codes)

# exercises 34-36 (FP8): the key's answers with one plausible change each
TILE = (SOLUTIONS / "ex34.py").read_text()
E8M0 = "import math\nimport numpy as np\ndef e8m0_exponent(block):\n    amax = float(np.abs(block).max())\n"
AMAX = (SOLUTIONS / "ex36.py").read_text()
WRONG[34] = [TILE.replace("s = np.float32(448 / amax)", "s = np.float32(amax / 448)"),          # the scale inverted
             TILE.replace("np.maximum(e - 1, -6) - 3", "e - 1 - 3"),                              # no subnormals
             TILE.replace("np.rint(y / spacing)", "np.trunc(y / spacing)"),                       # truncated
             TILE.replace("np.rint(y / spacing)", "np.floor(y / spacing + 0.5)"),                 # ties away from even
             TILE.replace("max(float(np.abs(tile).max()), 1e-12)", "float(tile.max())"),          # the signed max
             TILE.replace("s = np.float32(448 / amax)", "s = 448 / amax")]                        # a float64 scale
WRONG[35] = [E8M0 + "    return int(math.floor(math.log2(amax))) - 8 if amax else -127\n",          # OCP's floor rule
             E8M0 + "    return max(-127, min(127, round(math.log2(amax / 448)))) if amax else -127\n",  # rounded
             E8M0 + "    return max(-127, min(127, math.ceil(math.log2(amax / 256)))) if amax else -127\n",  # 2^8, not 448
             E8M0 + "    return math.ceil(math.log2(amax / 448)) if amax else -127\n",                # E8M0's range ignored
             E8M0 + "    return max(-127, min(127, math.ceil(math.log2(amax / 448)) + 1)) if amax else -127\n"]
WRONG[36] = [AMAX.replace('cut = "tp" if (layer == "row" or scaling == "tensor") else None', 'cut = "tp"'),   # rowwise
             AMAX.replace('cut = "tp" if (layer == "row" or scaling == "tensor") else None',
                          'cut = "tp" if layer == "row" else None'),                  # a column layer's tensor alone
             AMAX.replace('{"dp", "cp"} if fp8_gather', '{"dp"} if fp8_gather'),         # cp's slices forgotten
             AMAX.replace('{"dp", "cp"} if fp8_gather', '{"dp", "cp", "pp"} if fp8_gather'),   # other stages' weights
             AMAX.replace('spread = {cut} - {None}', 'spread = {cut, "dp"} - {None}')]     # the replicas' maxima too

# exercises 37-41 (documents, DeepSeek-V3, in-job recovery): the key's answer (hpcpar/course/solutions/) with
# one line changed
def _changed(number, old, new):
    text = (SOLUTIONS / f"ex{number:02d}.py").read_text()
    assert old in text, old
    return text.replace(old, new)


_POS = "0 if inputs[b, t] != inputs[b, t - 1] else positions[b, t - 1] + 1"
_KEPT = "kept = docs[:, 1:] == docs[:, :-1]"
_SEES = "k <= q and docs[k] == docs[q]"
_MLA = 'per_layer = model["kv_lora_rank"] + model["qk_rope_dim"]'
_SUMMED = 'summed = {"embed_tokens.weight": (first, last)}'
_SOURCE = "src = min((i for i in held if (key, part) in held[i]), key=lambda i: (sent[i], i))"
NEW = {
    37: [_changed(37, _POS, "t"),                                                             # never restart
         _changed(37, _POS, "1 if inputs[b, t] != inputs[b, t - 1] else positions[b, t - 1] + 1")
         .replace("np.zeros((B, T), dtype=np.int64)", "np.ones((B, T), dtype=np.int64)"),     # counted from 1
         _changed(37, _POS, "0 if docs[b, t + 1] != docs[b, t] else positions[b, t - 1] + 1"),  # end-of-text starts the next
         "import numpy as np\ndef packed_window(docs):\n    docs = np.asarray(docs)\n    inputs = docs[:, :-1]\n"
         "    flat = inputs.reshape(-1)\n    pos = np.zeros(len(flat), dtype=np.int64)\n    for i in range(1, len(flat)):\n"
         "        pos[i] = 0 if flat[i] != flat[i - 1] else pos[i - 1] + 1\n"
         "    return pos.reshape(inputs.shape), docs[:, 1:] == docs[:, :-1]\n",                # B x T flattened
         "import numpy as np\ndef packed_window(docs):\n    docs = np.asarray(docs)\n    inputs = docs[:, :-1]\n"
         "    seen, pos = {}, np.zeros(inputs.shape, dtype=np.int64)\n    for b in range(len(inputs)):\n"
         "        for t, d in enumerate(inputs[b]):\n            pos[b, t] = seen.get(int(d), 0)\n"
         "            seen[int(d)] = pos[b, t] + 1\n    return pos, docs[:, 1:] == docs[:, :-1]\n",   # one count an id
         _changed(37, _KEPT, "kept = np.concatenate([np.ones((B, 1), bool), inputs[:, 1:] == inputs[:, :-1]], 1)"),
         # ^ each document's first target dropped instead of its last
         _changed(37, _KEPT, "kept = np.concatenate([inputs[:, 1:] == inputs[:, :-1], np.ones((B, 1), bool)], 1)")],
         # ^ the window's last target always kept
    38: [_changed(38, _SEES, "k <= q"),                                                       # causal only
         _changed(38, "j = (r - s) % cp", "j = (r + s) % cp"),                                 # the ring's other way
         _changed(38, "    plan = []\n", "    def by_index(a, q, b, k):\n"                   # ids read at the index
                  "        return k <= q and docs[b] == docs[a] and (not window or q - k < window)\n\n"   # within the rank
                  "    plan = []\n")
         .replace("sum(any(sees(q, k) for k in theirs) for q in mine)",
                  "sum(any(by_index(a, q, b, k) for b, k in enumerate(theirs)) for a, q in enumerate(mine))")
         .replace("sum(any(sees(q, k) for q in mine) for k in theirs)",
                  "sum(any(by_index(a, q, b, k) for a, q in enumerate(mine)) for b, k in enumerate(theirs))"),
         _changed(38, "    c = T // (2 * cp)\n    return list(range(j * c, (j + 1) * c)) + "
                  "list(range((2 * cp - 1 - j) * c, (2 * cp - j) * c))",
                  "    n = T // cp\n    return list(range(j * n, (j + 1) * n))"),                   # contiguous slices
         _changed(38, _SEES, "docs[k] == docs[q]"),                                            # later keys of the document
         _changed(38, "q - k < window", "q - k <= window")],                                   # the window one too wide
    39: [_changed(39, _MLA, 'per_layer = 2 * model["kv_lora_rank"] + model["qk_rope_dim"]'),   # the latent as K and as V
         _changed(39, _MLA, 'per_layer = model["kv_lora_rank"]'),                              # the rotary key forgotten
         _changed(39, _MLA, 'per_layer = model["heads"] * (model["kv_lora_rank"] + model["qk_rope_dim"])'),  # per head
         _changed(39, _MLA, 'per_layer = model["heads"] * (model["head_dim"] + model["v_head_dim"])'),     # expanded
         _changed(39, 'heads = model["heads"] * (model["head_dim"] + model["v_head_dim"])',
                  'heads = 2 * model["heads"] * model["head_dim"]'),                           # GQA's, NKV = NH
         _changed(39, 'return itemsize * model["layers"] * per_layer, itemsize * model["layers"] * heads',
                  'return itemsize * per_layer, itemsize * heads')],                           # one layer
    40: [_changed(40, "at = (last, last_chunk) if mtp else None", "at = (0, 0) if mtp else None"),   # on rank 0
         _changed(40, _SUMMED, 'summed = {"lm_head.weight": (first, last)}'),                  # the head summed
         _changed(40, _SUMMED, 'summed = {"embed_tokens.weight": (first, last), "norm.weight": (first, last)}'),
         _changed(40, _SUMMED, 'summed = {"embed_tokens.weight": tuple(range(pp))}'),           # over every pp rank
         _changed(40, "if mtp and first != last else {}", "if mtp else {}"),                   # summed under a V too
         _changed(40, "return at, summed, (first,)", "return at, summed, (first, last) if summed else (first,)"),
         # ^ the copy counted in the norm
         _changed(40, "if mtp and first != last else {}", "if first != last else {}"),          # summed without MTP
         _changed(40, "first, last, last_chunk = 0, pp - 1, chunks - 1", "first, last, last_chunk = 0, pp - 1, 0")],
         # ^ interleaved's last rank, first chunk
    41: [_changed(41, "if (key, part) in held[dst]:\n                    src = dst\n                else:\n",
                  "if False:\n                    pass\n                else:\n"),                    # sends what is there
         _changed(41, _SOURCE, "src = min((r - sum(d < r for d in dead) for r in range(old[0] * old[1] * old[2])\n"
                  "                               if coords(r, *old)[1] == stage(name, old[1])\n"
                  "                               and (not tensors[name] or coords(r, *old)[0] == part)),\n"
                  "                              key=lambda i: (sent.get(i, 0), i))"),   # the old grid's holders, dead too
         _changed(41, "for part in range(old[0] if tensors[name] else 1):",
                  "for part in ([coords(survivors[dst], *old)[0]] if tensors[name] else [0]):"),   # its own old part
         _changed(41, "key=lambda i: (sent[i], i))", "key=lambda i: i)"),                       # always the lowest holder
         _changed(41, 'for key in [name] + [f"optimizer/{s}/{name}" for s in STATES])', "for key in [name])"),
         # ^ no optimizer state
         _changed(41, "    return places, plan",
                  "    return places, [e for e in plan if me in e[:2]] + [e for e in plan if me not in e[:2]]"),
         # ^ this rank's transfers first
         _changed(41, "    return places, plan", "    return places, [e for e in plan if me in e[:2]]"),  # its own only
         _changed(41, "places = {r: (i, coords(i, *new) if i < used else None) for i, r in enumerate(survivors)}",
                  "places = {r: (r, coords(r, *new) if r < used else None) for r in survivors}")],   # old numbers kept
}
for _number, _codes in NEW.items():
    WRONG.setdefault(_number, []).extend(_codes)

# exercise 42: Newton-Schulz as the template's lines say, with one of them changed
NS = ("import numpy as np\ndef newton_schulz(g, steps):\n    a, b, c = 3.4445, -4.7750, 2.0315\n"
      "    x = g.T if g.shape[0] > g.shape[1] else g\n    x = x / max(np.linalg.norm(x), 1e-7)\n"
      "    for _ in range(steps):\n        A = x @ x.T\n        x = a * x + (b * A + c * A @ A) @ x\n"
      "    return x.T if g.shape[0] > g.shape[1] else x\n")
ADDED_MUON = {
    42: [NS.replace("    x = x / max(np.linalg.norm(x), 1e-7)\n", ""),                          # never normalised
         NS.replace("max(np.linalg.norm(x), 1e-7)", "max(np.abs(x).max(), 1e-7)"),             # the largest entry
         NS.replace("x / max(np.linalg.norm(x), 1e-7)", "x / np.linalg.norm(x)"),              # zeros divided by 0
         NS.replace("(b * A + c * A @ A)", "(b * A + c * A)"),                                 # the cubic only
         NS.replace("range(steps)", "range(steps - 1)"),                                       # one step short
         NS.replace("a, b, c = 3.4445, -4.7750, 2.0315", "c, b, a = 3.4445, -4.7750, 2.0315"),  # a and c swapped
         NS.replace("    x = x / max", "    x /= max")],                                       # G changed in place
    43: ["ANSWER = (1.0, 1.0)\n",                                     # blockwise taken for the exact modes
         "ANSWER = (2.0, 4.0)\n",                                     # tp, not its square root
         "ANSWER = (0.7071, 0.5)\n",                                  # 1 / sqrt(tp)
         "ANSWER = (1.4142, 1.7321)\n",                               # sqrt(3) at tp 4: one block short
         "ANSWER = 1.4142\n"],                                        # one number, not a pair
}
for _number, _codes in ADDED_MUON.items():
    WRONG.setdefault(_number, []).extend(_codes)


# exercise 44: the owners and the numbers handed, as the solution writes them, one rule changed
OWN = (SOLUTIONS / "ex44.py").read_text()
FRESH = "        mine, k = [0] * len(sizes), [0] * n\n"
LEAST = "r = min(range(n), key=lambda r: load[r])"
WRONG[44] = [
    OWN.replace(FRESH, FRESH + "        load = [0] * n\n"),                                  # buffer by buffer
    OWN.replace("key=lambda j: -sizes[j]", "key=lambda j: sizes[j]"),                      # shortest first
    OWN.replace(LEAST, "r = min(range(n), key=lambda r: (load[r], -r))"),                 # ties to the highest
    OWN.replace("handed += n * max(k) + max(k)", "handed += sum(sizes) + k[0]"),                # no padding
    OWN.replace("handed += n * max(k) + max(k)", "handed += n * max(k)"),                      # the all-gather left out
    OWN.replace(LEAST, "r = j % n"),                                                      # round robin
]
