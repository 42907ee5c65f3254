"""The V schedules: two chunks per rank placed as a V, rank r holding stage r on the way down and stage
2p-1-r on the way back up (``v_stage``), so that the last rank turns the V with no message and rank 0
holds both the inputs and the loss.

    zb-v        Qi et al. 2024, section 6: zero bubble at F = B = W with 1F1B's memory (p whole stages)
    dualpipev   DeepSeek's DualPipe cut in half (Sea AI Lab): F&B pairs, each one's messages hidden
                behind the other's compute

Each order is a function ``(rank, p, m, v) -> [Action]`` declared in schedules.py's ``KINDS``, like the
flat schedules'; the simulator, the engine and the checks treat them alike (docs/pipeline.md).
"""
from collections import Counter, deque

from hpcpar.pipeline.actions import Action


def v_stage(rank, chunk, stages):
    """The V placement of two chunks per rank: rank r holds stage r on the way down and stage
    2p-1-r on the way back up, so the last rank runs stages p-1 and p back to back (no message) and
    rank 0 holds both the first stage (inputs) and the last (loss)."""
    return rank if chunk == 0 else 2 * stages - 1 - rank


class _Counters:
    """The next micro-batch of each (op, chunk) on one rank: V schedules run every op of a chunk in
    micro-batch order, so an order is a sequence of (op, chunk) and this numbers them."""

    def __init__(self):
        self.next = Counter()

    def __call__(self, op, chunk, overlap=False):
        mb = self.next[op, chunk]
        self.next[op, chunk] += 1
        return Action(op, mb, chunk, overlap=overlap)


def zb_v(rank, p, m, v):
    # Qi et al. 2024, section 6.  Chunk 0 is stage r going down, chunk 1 stage 2p-1-r coming back.
    # Micro-batch 0 reaches rank r's chunk 1 after the 2p-1-r stages before it, so rank r fills
    # that wait with 2(p-r)-1 chunk-0 forwards and then r (F.1, F) pairs as the first F.1 arrive.
    # From then on every forward is followed by its chunk's B and W (F B W per chunk, chunk 1
    # first in warm-up), which keeps at most 2p chunk activations alive: p whole stages, as 1F1B.
    # In the cool-down the Ws are kept back to fill the gaps while the last Bs travel down the V.
    # With m < 2p-1 the order is the one for 2p-1 with the micro-batches that do not exist left
    # out (the survivors keep their relative order, so no dependency turns round).
    n = max(m, 2 * p - 1)
    nxt, acts = _Counters(), []
    acts += [nxt("F", 0) for _ in range(2 * (p - rank) - 1)]
    for _ in range(rank):
        acts += [nxt("F", 1), nxt("F", 0)]
    for _ in range(p - rank):
        acts += [nxt("F", 1), nxt("B", 1), nxt("W", 1)]
    while nxt.next["F", 0] < n or nxt.next["F", 1] < nxt.next["F", 0]:
        if nxt.next["F", 0] < n:
            acts.append(nxt("F", 0))
        acts += [nxt("B", 0), nxt("W", 0), nxt("F", 1), nxt("B", 1), nxt("W", 1)]
    for _ in range(rank):
        acts += [nxt("B", 0), nxt("B", 1)]
    for _ in range(p - rank):
        acts += [nxt("B", 0), nxt("W", 0)]
    for c in (1, 0):
        acts += [nxt("W", c) for _ in range(nxt.next["B", c] - nxt.next["W", c])]
    return [a for a in acts if a.mb < m]


def dualpipev(rank, p, m, v):
    # DeepSeek's DualPipe cut in half (Sea AI Lab), in eight phases; "F.1&B" is one F&B pair, a
    # forward of one micro-batch overlapped with a backward of another, so that each one's
    # messages hide behind the other's compute.  A B that needs no W soon is followed by its W at
    # once (a full backward); the Ws of the Bs marked "zb" below wait in a queue and fill gaps.
    nxt, acts, queue = _Counters(), [], deque()

    def backward(c, zero_bubble=False, paired=False):
        """B of chunk c (after a forward of the other chunk when ``paired``), its W now or queued."""
        if paired:
            acts.append(nxt("F", 1 - c, overlap=True))
        b = nxt("B", c)
        acts.append(b)
        if zero_bubble:
            queue.append(b)
        else:
            acts.append(Action("W", b.mb, c))

    def weight():
        b = queue.popleft()
        acts.append(Action("W", b.mb, b.chunk))

    acts += [nxt("F", 0) for _ in range(2 * (p - rank - 1))]          # 1: chunk-0 warm-up
    for _ in range(rank + 1):                                          # 2: both chunks fill
        acts += [nxt("F", 0), nxt("F", 1)]
    for _ in range(p - rank - 1):                                      # 3: first backwards, W at once
        backward(1, zero_bubble=True)
        weight()
        acts.append(nxt("F", 1))
    for i in range(m - 2 * p + rank + 1):                              # 4: steady, pairs
        if i == 0 and rank == p - 1:
            acts.append(nxt("F", 0))                                   # its B.1 waits for this F: no pair
            backward(1)
        else:
            backward(1, paired=True)
        backward(0, paired=True)
    for _ in range(p - rank - 1):                                      # 5: chunk 0's forwards are done
        backward(1)
        backward(0, paired=True)
    for i in range(rank + 1):                                          # 6: backwards only, W deferred
        half = i >= (rank + 1) // 2                                    # from half-way
        backward(1, zero_bubble=half and (rank % 2 == 1 or i > (rank + 1) // 2))
        backward(0, zero_bubble=half)
    for _ in range(p - rank - 1):                                      # 7: deferred Ws fill the wait
        weight()
        backward(0, zero_bubble=True)
    while queue:                                                       # 8: the rest of the Ws
        weight()
    return acts
