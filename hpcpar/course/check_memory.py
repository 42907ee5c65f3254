"""Recomputation exercise: what a GPT-2 block keeps between its forward and its backward, and how many
times its attention runs, with no, selective and full recomputation - measured on the block itself
(hpcpar/nn/block.py, nn/attention_core.py)."""
import numpy as np

from hpcpar.course.wrong import Wrong

BLOCK = dict(batch=2, seq_len=16, d_model=32, n_head=4)       # float64, no dropout
MODES = {"none": (False, False), "selective": (False, True), "full": (True, False)}


def measure():
    """{mode: (numbers the block's cache holds after the forward, attention forwards in forward + backward)}"""
    from hpcpar.nn import attention_core
    from hpcpar.nn.block import TransformerBlock
    from hpcpar.nn.gpt import GPTConfig
    from hpcpar.nn.module import cache_bytes
    cfg = GPTConfig(vocab_size=32, seq_len=BLOCK["seq_len"], n_layer=1, n_head=BLOCK["n_head"], d_model=BLOCK["d_model"])
    block = TransformerBlock(cfg, 0, 0, "float64")
    x = np.random.default_rng(0).standard_normal((BLOCK["batch"], BLOCK["seq_len"], BLOCK["d_model"]))
    counted, calls = attention_core.attention_forward, [0]

    def counting(*args):
        calls[0] += 1
        return counted(*args)
    out = {}
    attention_core.attention_forward = counting
    try:
        for mode, (full, selective) in MODES.items():
            block.recompute, block.attn.selective, calls[0] = full, selective, 0
            y, cache = block.forward(x)
            kept = cache_bytes(cache) // x.itemsize
            block.backward(np.ones_like(y), cache)
            out[mode] = (kept, calls[0])
    finally:
        attention_core.attention_forward = counted
    return out


def recompute_answer():
    """Reference: (numbers kept under full recomputation, numbers selective keeps fewer than none,
    attention forwards per micro-batch under none, selective, full)."""
    m = measure()
    return m["full"][0], m["none"][0] - m["selective"][0], tuple(m[mode][1] for mode in MODES)


def check_recompute(answer):
    want = recompute_answer()
    if not (isinstance(answer, tuple) and len(answer) == 3):
        raise Wrong(f"ANSWER is a triple (kept under full, saved by selective, (forwards none, selective, full)), "
                    f"got {answer!r}")
    for what, got, right in (("the numbers full recomputation keeps", answer[0], want[0]),
                             ("the numbers selective saves", answer[1], want[1])):
        if got != right:
            raise Wrong(f"{what}, {got}, are too {'many' if got > right else 'few'}")
    if tuple(answer[2]) != want[2]:
        mode = next(m for m, g, w in zip(MODES, answer[2], want[2]) if g != w)
        raise Wrong(f"the attention forwards under {mode} recomputation are not {answer[2][list(MODES).index(mode)]}")
