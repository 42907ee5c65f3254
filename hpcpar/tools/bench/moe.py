"""The mixture-of-experts block, forward + backward, against PyTorch eager of the same block.

The reference is transformers' MixtralSparseMoeBlock with its eager experts: a loop over the experts
hit, each gathering its tokens (index by token), running its SwiGLU MLP and adding the weighted
output back (index_add_), autograd for the backward.  Ours (nn/moe.py) sorts the choices by expert
once and runs one GEMM per expert and projection on contiguous rows (ops/moe.py).  Same weights, same
input, float32, one thread each; CPU time, interleaved rounds (common.py), each round ``REPEAT`` steps
a side (a ~0.1 s step alone moves by tens of per cent when anything else wakes on the core), and the
target is the median of the rounds' ratios, quoted with its spread as the peer rows are.
"""
import numpy as np

from hpcpar.tools.bench.common import Result, import_torch, interleave, ms, ratio, spread, summary

MODEL = dict(tokens=2048, d_model=256, d_ff=512, n_expert=8, top_k=2)
QUICK_MODEL = dict(tokens=256, d_model=64, d_ff=128, n_expert=4, top_k=2)
REPEAT = 5
ROUNDS = 7       # more than the peer rows' 5: at ~0.5 s a side a round is short, and 7 cost ~8 s


def blocks(dims, torch):
    """(our MoE, transformers' block) holding the same random weights."""
    import transformers
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    from hpcpar.nn.gpt import preset
    from hpcpar.nn.moe import MoE
    config = transformers.MixtralConfig(hidden_size=dims["d_model"], intermediate_size=dims["d_ff"],
                                        num_local_experts=dims["n_expert"], num_experts_per_tok=dims["top_k"])
    config._experts_implementation = "eager"
    theirs = MixtralSparseMoeBlock(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0.0, 0.1)
    cfg = preset("mixtral-tiny", vocab_size=8, d_model=dims["d_model"], d_ff=dims["d_ff"], n_expert=dims["n_expert"],
                 top_k=dims["top_k"])
    ours = MoE("layers.0.mlp", cfg, 0, np.float32)
    ours.gate.weight.data[...] = theirs.gate.weight.detach().numpy().T
    ours.experts.gate_up.data[...] = theirs.experts.gate_up_proj.detach().numpy().transpose(0, 2, 1)
    ours.experts.down.data[...] = theirs.experts.down_proj.detach().numpy().transpose(0, 2, 1)
    return ours, theirs


def run(quick):
    res = Result()
    torch, why = import_torch()
    if torch is None:
        res.notes.append(why)
        return res
    dims = QUICK_MODEL if quick else MODEL
    ours, theirs = blocks(dims, torch)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, dims["tokens"], dims["d_model"])).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    dy_t = torch.tensor(dy)

    def hpcpar_step():
        for _ in range(REPEAT):
            y, cache = ours.forward(x)
            ours.backward(dy, cache)

    def torch_step():
        for _ in range(REPEAT):
            xt = torch.tensor(x, requires_grad=True)
            theirs(xt).backward(dy_t)

    times = interleave({"hpcpar": hpcpar_step, "PyTorch eager": torch_step}, 3 if quick else ROUNDS)
    times = {k: [t / REPEAT for t in v] for k, v in times.items()}
    fig = summary(times, "hpcpar", "PyTorch eager")
    res.figures["moe_block"] = fig
    shape = (f"N = {dims['tokens']} tokens, C = {dims['d_model']}, F = {dims['d_ff']}, E = {dims['n_expert']}, "
             f"k = {dims['top_k']}, float32")
    res.table(f"The MoE block, forward + backward ({shape})",
              ["implementation", "step (median)", "vs PyTorch eager: median of the rounds (range)"],
              [["hpcpar (permutation + grouped GEMM)", ms(fig["ours_median_s"]), spread(fig)],
               ["PyTorch eager (transformers' loop over experts)", ms(fig["theirs_median_s"]), ratio(1.0)]],
              [f"CPU time per step, one thread each; each round times {REPEAT} steps a side; the best rounds' "
               f"ratio is {ratio(fig['ratio'])}."])
    res.target("the MoE block's forward + backward against PyTorch eager's loop over experts (median of rounds)",
               "<= 0.9x", spread(fig), fig["ratio_median_paired"] <= 0.9)
    return res
