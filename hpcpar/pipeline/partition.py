"""Cutting the model into pipeline stages: which blocks does each virtual stage hold?

A stage's time is set by its work, and the slowest stage paces the whole pipeline, so the cut should
balance the work.  The first stage also embeds and the last one computes the head and the loss, which
is why a plain even cut is not always best (GPT-2 small: the 50257 x 768 embedding is as large as 3
blocks).  Methods:

    uniform         blocks spread as evenly as possible (sizes differ by at most one), the first
                    stages taking the remainder
    ends-light      as even, the remainder to the middle stages first (Megatron's and DeepSpeed's
                    published runs: BLOOM's 5 + 6*10 + 5 of 70 layers, Llama 3's 7 + 8*14 + 7 of 126)
    params          balance parameters, counting the embedding on the first and the head on the last
    flops           balance forward FLOPs per token likewise (attention's T-dependent part included)
    "3,3,2"         an explicit list of block counts (may be uneven, may contain 0); must sum to L

Balanced cuts minimise the largest stage cost over contiguous cuts (dynamic programming, O(S L^2)).
A cut never drops a block: the counts always sum to the number of blocks, or the request is refused.
"""
from hpcpar.flops import gpt_head_forward_flops
from hpcpar.runtime import UsageError


def counts_to_ranges(counts):
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return out


def balanced(costs, n_stages, first_extra=0.0, last_extra=0.0):
    """Contiguous split of per-block ``costs`` into n_stages minimising the maximum stage cost."""
    L = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def stage_cost(s, a, b):            # blocks [a, b) on stage s
        extra = (first_extra if s == 0 else 0.0) + (last_extra if s == n_stages - 1 else 0.0)
        return prefix[b] - prefix[a] + extra

    inf = float("inf")
    best = [[inf] * (L + 1) for _ in range(n_stages + 1)]   # best[s][b]: first s stages hold blocks [0, b)
    cut = [[0] * (L + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, n_stages + 1):
        for b in range(L + 1):
            for a in range(b + 1):
                v = max(best[s - 1][a], stage_cost(s - 1, a, b))
                if v < best[s][b]:
                    best[s][b], cut[s][b] = v, a
    counts, b = [], L
    for s in range(n_stages, 0, -1):
        a = cut[s][b]
        counts.append(b - a)
        b = a
    return counts[::-1]


def gpt_block_costs(cfg, method):
    """(per-block cost, first-stage extra, last-stage extra) for a GPT config.  On several stages the
    last one holds the output projection - its own copy of the token embedding when tied - and the MTP
    modules (with a copy of the token embedding); a mixture of experts' first blocks may be dense."""
    shape = cfg.shape
    if method == "params":
        mtp = shape.mtp_params() + (cfg.embedding_params() if cfg.mtp_depth else 0)
        return ([cfg.block_params(i) for i in range(cfg.n_layer)], cfg.embedding_params(),
                cfg.head_params(own_weight=True) + mtp)
    return ([shape.block_forward_flops(cfg.seq_len, i) for i in range(cfg.n_layer)], 0,
            gpt_head_forward_flops(cfg) + shape.mtp_forward_flops(cfg.seq_len))


def ends_light(n_layers, n_stages):
    """Block counts: n // S each, the n % S extra ones to the middle stages first, so the end stages
    (embedding, head) get the fewest."""
    base, extra = divmod(n_layers, n_stages)
    counts = [base] * n_stages
    order = sorted(range(n_stages), key=lambda i: (abs(i - (n_stages - 1) / 2), i))
    for i in order[:extra]:
        counts[i] += 1
    return counts


def partition(n_layers, n_stages, method="uniform", cfg=None):
    """Block index ranges of each of ``n_stages`` virtual stages."""
    if isinstance(method, (list, tuple)) or (isinstance(method, str) and "," in method):
        words = method.split(",") if isinstance(method, str) else method
        counts = [int(c) for c in words if str(c).strip().isdigit()]
        if len(counts) != len(words) or len(counts) != n_stages or sum(counts) != n_layers:
            raise UsageError(f"--partition {','.join(map(str, words))}: need {n_stages} non-negative "
                             f"block counts summing to {n_layers} layers")
        return counts_to_ranges(counts)
    if method == "uniform":
        q, r = divmod(n_layers, n_stages)
        return counts_to_ranges([q + (1 if s < r else 0) for s in range(n_stages)])
    if method == "ends-light":
        return counts_to_ranges(ends_light(n_layers, n_stages))
    if method in ("params", "flops"):
        if cfg is None or not hasattr(cfg, "vocab_size"):
            return partition(n_layers, n_stages, "uniform")
        costs, first, last = gpt_block_costs(cfg, method)
        return counts_to_ranges(balanced(costs, n_stages, first, last))
    raise UsageError(f"unknown --partition {method!r}: uniform, ends-light, params, flops or a list like 3,3,2")
