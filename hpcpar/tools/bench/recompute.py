"""Activation recomputation: what a micro-batch keeps between its forward and its backward, and what
rebuilding it costs - none, selective (attention's probabilities only) and full - for GPT-2 and Llama.

One rank, the benchmark model's width and depth at a longer sequence (the probabilities grow with T^2,
the rest with T), float32.  Per mode:

    kept        bytes of the distinct arrays the stage's caches hold after the forward (nn/module.py
                cache_bytes: what stays in memory per micro-batch in flight)
    peak        the largest amount numpy had allocated during forward + backward (tracemalloc, which
                sees numpy's buffers), counted from before the forward
    step        forward + backward time, interleaved with the other modes (CPU time); as a ratio to
                no recomputation, round by round

Selective recomputation (Korthikanti et al. 2022) should keep far less than none at a few percent more
time; full keeps only each block's input at about one more forward (a third more compute).
"""
import tracemalloc

import numpy as np

from hpcpar.tools.bench.common import Result, best, interleave, paired_ratio, ratio, size

MODES = {"none": (False, False), "selective": (False, True), "full": (True, False)}
MODEL = dict(d_model=256, n_layer=4, n_head=4, seq_len=512, batch=2)
QUICK_MODEL = dict(d_model=64, n_layer=2, n_head=4, seq_len=64, batch=2)


def stage(arch, dims):
    from hpcpar.nn import GPT
    from hpcpar.nn.gpt import GPTConfig
    own = {"gpt2": {},     # each family's settings beyond the shared dims
           "llama": dict(n_kv_head=dims["n_head"] // 2, tied=False, d_ff=8 * dims["d_model"] // 3)}[arch]
    cfg = GPTConfig(vocab_size=1024, seq_len=dims["seq_len"], n_layer=dims["n_layer"], n_head=dims["n_head"],
                    d_model=dims["d_model"], arch=arch, **own)
    return GPT(cfg, seed=0, dtype="float32")


def step_function(model, ids, targets, mode):
    def step():
        model.set_recompute(*MODES[mode])
        loss, caches = model.forward(ids, None, targets)
        model.backward(1.0 / targets.size, caches)
    return step


def memory(model, ids, targets, mode):
    """(bytes kept after the forward, peak bytes during forward + backward)"""
    from hpcpar.nn.module import cache_bytes
    model.set_recompute(*MODES[mode])
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    _, caches = model.forward(ids, None, targets)
    kept = cache_bytes(caches)
    model.backward(1.0 / targets.size, caches)
    del caches
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return kept, peak


def run(quick):
    dims = QUICK_MODEL if quick else MODEL
    rounds = 2 if quick else 3
    tokens = np.random.default_rng(0).integers(0, 1024, size=(dims["batch"], dims["seq_len"] + 1))
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    res = Result()
    rows = []
    for arch in ("gpt2", "llama"):
        model = stage(arch, dims)
        mem = {mode: memory(model, ids, targets, mode) for mode in MODES}
        times = interleave({mode: step_function(model, ids, targets, mode) for mode in MODES}, rounds)
        for mode in MODES:
            kept, peak = mem[mode]
            rows.append([arch, mode, size(kept), ratio(kept / mem["none"][0]), size(peak), ratio(peak / mem["none"][1]),
                         f"{best(times[mode]) * 1e3:.0f} ms", ratio(paired_ratio(times[mode], times["none"]))])
            res.figures[f"{arch}_{mode}"] = {"kept_bytes": kept, "peak_bytes": peak, "step_s": best(times[mode]),
                                             "time_ratio": paired_ratio(times[mode], times["none"])}
        sel = res.figures[f"{arch}_selective"]
        res.target(f"{arch}: selective recomputation keeps less than none, for at most 1.25x the time",
                   "kept < none, time <= 1.25x", f"{ratio(sel['kept_bytes'] / mem['none'][0])}, "
                   f"{ratio(sel['time_ratio'])}", sel["kept_bytes"] < mem["none"][0] and sel["time_ratio"] <= 1.25)
    shape = f"{dims['n_layer']} layers, C = {dims['d_model']}, {dims['n_head']} heads, T = {dims['seq_len']}, " \
            f"B = {dims['batch']}"
    res.table(f"Recomputation on one rank ({shape}, float32): memory kept per micro-batch, peak, step time",
              ["model", "recompute", "kept after forward", "vs none", "peak in step", "vs none", "step",
               "time vs none"], rows,
              ["kept: bytes of the distinct arrays the caches hold after the forward; peak: numpy's largest "
               "allocation total during forward + backward (tracemalloc); time: CPU time, best of the rounds, "
               "and the median ratio to no recomputation taken round by round."])
    return res
