"""Attention over packed windows of documents (--documents, ops/masks.py) against plain causal attention:
the attention core's forward + backward (ops/attention.py, query blocks of 64 rows) over windows of 4
documents of T/4 tokens each, and over the same windows as one document.

Each query block sees keys from its first query's document on: a block of document d skips the key
blocks of documents 0 .. d-1.  The score entries computed (``blocks_work``) fall to (T/256 + 1) /
(T/64 + 1) of the plain causal blocks' - a third at T = 512, 0.29 at 1024 - and the time should
follow, less what the rule's rectangular mask costs beside the cached causal square.  CPU time, interleaved rounds, the
median ratio round by round; one rank, float32.
"""
import numpy as np

from hpcpar.tools.bench.common import Result, best, interleave, paired_ratio, ratio

SHAPES = [dict(B=2, NH=4, T=512, HS=64), dict(B=1, NH=4, T=1024, HS=64)]
QUICK_SHAPES = [dict(B=1, NH=2, T=256, HS=32)]


def attention_step(q, k, v, do, mask):
    """One forward + backward of the core over (B, NH, T, HS) arrays, under ``mask`` (None: causal)."""
    from hpcpar.ops.attention import attention_backward, attention_forward

    def step():
        attention_backward(do, attention_forward(q, k, v, attn_mask=mask)[1])
    return step


def run(quick):
    from hpcpar.ops.attention import QUERY_BLOCK, blocks_work
    from hpcpar.ops.masks import Mask
    res, rows = Result(), []
    for s in QUICK_SHAPES if quick else SHAPES:
        B, NH, T, HS = s["B"], s["NH"], s["T"], s["HS"]
        q, k, v, do = (np.random.default_rng(i).standard_normal((B, NH, T, HS)).astype(np.float32) for i in range(4))
        mask = Mask(np.repeat(np.arange(4), T // 4)[None].repeat(B, axis=0))          # 4 documents of T/4
        done, plain = blocks_work(T, QUERY_BLOCK, mask)
        times = interleave({"causal": attention_step(q, k, v, do, None),
                            "documents": attention_step(q, k, v, do, mask)}, 3 if quick else 7)
        r = paired_ratio(times["documents"], times["causal"])
        rows.append([f"{B} x {NH} x {T} x {HS}", f"{best(times['causal']) * 1e3:.1f} ms",
                     f"{best(times['documents']) * 1e3:.1f} ms", ratio(r), f"{done / plain:.2f}"])
        res.figures[f"T{T}"] = {"causal_s": best(times["causal"]), "documents_s": best(times["documents"]),
                                "ratio": r, "work": done / plain}
        res.target(f"T = {T}: 4 documents take at most 0.75x plain causal attention's time", "<= 0.75x",
                   ratio(r), r <= 0.75)
    res.table("Attention core (forward + backward, float32, query blocks of 64) over windows of 4 documents, "
              "against the same windows as one document", ["B x NH x T x HS", "plain causal", "4 documents",
                                                           "time", "score entries"], rows,
              ["time: CPU time, best of the rounds; the ratio the median round by round.  Score entries: those "
               "the documents' blocks compute over the plain causal blocks' (ops/attention.blocks_work)."])
    return res
