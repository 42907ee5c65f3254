"""Turn a serial model stage into its tensor-parallel version, in place.

Each layer is built serially first (full parameters, from the seed) and then swapped for its parallel
counterpart, which keeps only this rank's slice.  So tp = 1, 2 and 4 start from the same model, and
gathering the slices gives back the full tensors.

GPT block:   ln_1 -> [c_attn: column, groups Q|K|V] -> heads -> [c_proj: row] -> ln_2 ->
             [c_fc: column] -> GELU -> [mlp.c_proj: row]           2 all-reduces forward, 2 backward
Llama block: rmsnorm -> [q_proj, k_proj, v_proj: column, by heads, one input region] -> rope,
             repeat K/V, heads -> [o_proj: row] -> rmsnorm -> [gate_proj, up_proj: column, one input
             region] -> SwiGLU -> [down_proj: row]          2 all-reduces forward, 2 backward, as GPT-2
             K/V heads are cut like query heads: rank r holds query heads r NH/tp .. and exactly the
             K/V heads they read, r NKV/tp .., so tp must divide NKV as well as NH; QK-norm (Qwen3)
             normalises each head on its own rank, its two gains whole on every rank, their gradients
             summed over TP (each rank's holds its heads' share)
DeepSeek:    rmsnorm -> [f, or the sequence all-gather, once on x] -> down-projections and latent norms
             whole on every rank -> [q_b_proj (q_proj), kv_b_proj: columns by heads, no communication] ->
             rope, heads -> [o_proj: row]: 1 all-reduce forward, 1 backward (nn/mla.py); the whole parts'
             gradients this rank's heads' share, summed over TP (as QK-norm's); its first dense MLPs as Llama's
MoE block:   attention cut as above; the mixture of experts (router, experts, shared experts) is
             replicated: every TP rank runs it on the tokens it holds (all of them, or with sequence
             parallelism its own slice of the sequence); no all-reduce around it
GPT ends:    embedding -> vocab-parallel; LM head -> vocab-parallel logits and loss
Deep MLP:    each block column + row; the input and output layers stay replicated.

Which attribute of a block is cut how is the family's tensor-parallel plan (``Parts.tp`` in
nn/architectures.py's ``ARCHITECTURES``); this module only applies it.
"""
from operator import attrgetter

from hpcpar.nn.gpt import GPT
from hpcpar.nn.linear import Projections
from hpcpar.nn.moe import MoE
from hpcpar.runtime import UsageError
from hpcpar.tensor_parallel.layers import (ColumnParallelLinear, ColumnParallelProjections, HeadParallelLinear,
                                           RegionEntry, RowParallelLinear, VocabParallelEmbedding,
                                           VocabParallelLMHead, replicate)


def check_divisible(cfg, tp, sequence_parallel, seq_len=None):
    """Refuse shapes that do not cut evenly - before any rank communicates."""
    if tp == 1:
        return
    n_head = getattr(cfg, "n_head", None)
    if n_head is not None and n_head % tp:
        raise UsageError(f"--tp {tp} must divide the number of attention heads ({n_head})")
    n_kv_head = getattr(cfg, "n_kv_head", n_head)
    if n_kv_head is not None and n_kv_head % tp:
        raise UsageError(f"--tp {tp} must divide the number of key/value heads ({n_kv_head}): each rank "
                         f"holds the K/V heads of its own query heads")
    for width in {cfg.d_ff, getattr(cfg, "dense_ff", cfg.d_ff)}:           # a mixture of experts' dense layers
        if width % tp:
            raise UsageError(f"--tp {tp} must divide the feed-forward width ({width})")
    if sequence_parallel:
        if n_head is None:
            raise UsageError("sequence parallelism needs a model with a sequence axis (a GPT)")
        if seq_len % tp:
            raise UsageError(f"--sequence-parallel: --tp {tp} must divide the sequence length ({seq_len})")


def parallelize(stage, comm, sequence_parallel=False):
    """Swap every layer of ``stage`` for its tensor-parallel version over ``comm``. Returns ``stage``."""
    if comm.size == 1:
        return stage
    sp = sequence_parallel
    parts = stage.cfg.parts if isinstance(stage, GPT) else None      # the family's plan (nn/gpt.py)
    for block in stage.transformer_blocks():
        if parts is None:                                             # the deep MLP's block
            cut(block, comm, sp, columns=("c_fc",), rows=("c_proj",))
            continue
        for c in parts.tp:
            module = getattr(block, c.module)
            if isinstance(module, MoE):     # experts whole on every TP rank (docs/moe.md, "Experts and TP")
                replicate(module.parameters(), comm, sp)
                continue
            cut(module, comm, sp, columns=c.columns, rows=c.rows, groups=c.groups)
            for name in c.inner:                                      # MLA: inside the region entered once
                if getattr(module, name) is not None:
                    setattr(module, name, HeadParallelLinear(getattr(module, name), comm))
            if c.entry:
                setattr(module, c.entry, RegionEntry(comm, sp))
        if parts.tp_head_offset:
            block.attn.head_offset = comm.rank * block.attn.n_head // comm.size
        replicate([p for name in parts.tp_replicated for p in getattr(block, name).parameters()], comm, sp)
        per_head = (attrgetter(name)(block) for name in parts.tp_per_head)      # None: the model has none
        replicate([p for module in per_head if module is not None for p in module.parameters()], comm, True)
    if isinstance(stage, GPT):
        if stage.embed is not None:
            stage.embed = VocabParallelEmbedding(stage.embed, comm, sp)
        if stage.head is not None:
            stage.head = VocabParallelLMHead(stage.head, comm, sp)
            mtp = stage.head.mtp                  # the MTP modules: blocks cut above, their lookup vocabulary-parallel
            if mtp is not None:
                mtp.embed = VocabParallelEmbedding(mtp.embed, comm, sp)
                replicate([p for m in mtp.depths for p in m.replicated()], comm, sp)
    else:
        for part in (stage.embed, stage.head):
            if part is not None:
                replicate(part.parameters(), comm, False)
    return stage


def cut(module, comm, sequence_parallel, columns, rows, groups=1):
    """Replace the named Linear (or Projections) attributes of ``module`` by their column- and
    row-parallel versions."""
    for name in columns:
        layer = getattr(module, name)
        setattr(module, name, ColumnParallelProjections(layer, comm, sequence_parallel)
                if isinstance(layer, Projections) else ColumnParallelLinear(layer, comm, sequence_parallel, groups))
    for name in rows:
        setattr(module, name, RowParallelLinear(getattr(module, name), comm, sequence_parallel))
