"""Which ranks hold the pieces of a GEMM operand, and the layouts whose pieces a scale would straddle.

A linear layer's operands have three dimensions between them (recipes.py): N tokens, K inputs, M
outputs.  A layout cuts some of them across ranks:

    layer kind   N (tokens)     K (inputs)    M (outputs)
    serial       cp             -             -
    column       cp             -             tp            Y = X [W_1 | ... | W_tp]
    row          cp             tp            -             Y = sum_i X_i W_i

(sequence parallelism gathers the tokens over tp before each GEMM and data parallelism gives each
replica micro-batches of its own, so neither cuts a GEMM operand; ZeRO-3 gathers the weights before
the GEMM - or, with --fp8-param-gather, quantises the slices with the scale of the whole weight.)
A scale's amax is the maximum over the ranks of every axis its piece spans (``axes``): a whole
tensor spans both of its dimensions' axes, a row the contraction's; tiles and blocks must lie on one
rank, so a layout in which a piece would cross a cut is refused (``refusal``) before any rank
communicates, with one line.
"""
from hpcpar.fp8.recipes import OPERANDS, blocks_along

CUTS = {"serial": {"N": "cp"}, "column": {"N": "cp", "M": "tp"}, "row": {"N": "cp", "K": "tp"}}


def axes(kind, gemm, operand):
    """The grid axes (or None) that cut the two dimensions of ``operand`` as ``gemm`` takes it."""
    dims = dict(OPERANDS[gemm])[operand]
    return tuple(CUTS[kind].get(d) for d in dims)


def cut_extents(mcfg, tp):
    """{what: length on one rank} of every dimension tensor parallelism cuts in the quantised layers:
    the attention heads' features (query, and key/value) and the feed-forward width."""
    if tp == 1:
        return {}
    if not hasattr(mcfg, "n_head"):                                 # the deep MLP: c_fc column, c_proj row
        return {"the feed-forward width": mcfg.d_ff // tp}
    head_dim = mcfg.head_dim or mcfg.d_model // mcfg.n_head
    out = {"the query heads' features": mcfg.n_head * head_dim // tp,
           "the key/value heads' features": mcfg.n_kv_head * head_dim // tp}
    if not mcfg.n_expert:
        out["the feed-forward width"] = mcfg.d_ff // tp
    return out


def token_run(seq_len, cp, documents):
    """The run of consecutive positions a context-parallel rank holds (ops/ring_attention.py: 2 cp
    chunks, or 4 cp when documents are dealt and they divide the sequence); the whole sequence at cp 1."""
    if cp == 1:
        return seq_len
    n = 4 * cp if documents and seq_len % (4 * cp) == 0 else 2 * cp
    return seq_len // n


def refusal(recipe, mcfg, tp, cp, documents=False):
    """One line if a tile or block of ``recipe`` would straddle two ranks in this layout, else None."""
    if getattr(mcfg, "kv_lora_rank", 0):
        return (f"--precision {recipe.name}: latent attention's projections (MLA) have no FP8 recipe here yet; "
                f"use --precision bf16 with this model")
    for what, extent in cut_extents(mcfg, tp).items():
        for gemm, operands in OPERANDS.items():
            for operand, dims in operands:
                edge = max(blocks_along(recipe, gemm, operand, d) for d in dims if d != "N")
                if edge and extent % edge:
                    return (f"--precision {recipe.name}: --tp {tp} leaves {extent} of {what} on each rank, not a "
                            f"multiple of the {edge}-wide scaling blocks, which would straddle two ranks "
                            f"(a smaller --tp" + (", or --fp8-block)" if recipe.name == "fp8-blockwise" else ")"))
    edge = max(blocks_along(recipe, "weight", o, "N") for o, _ in OPERANDS["weight"])
    run = token_run(getattr(mcfg, "seq_len", 0), cp, documents)
    if cp > 1 and edge and run % edge:
        return (f"--precision {recipe.name}: --cp {cp} gives each rank runs of {run} positions, not a multiple "
                f"of the {edge}-token scaling blocks of the weight gradient, which would straddle two ranks "
                f"(a longer --seq-len, a smaller --cp" + (", or --fp8-block)" if recipe.name == "fp8-blockwise" else ")"))
    return None
