"""Which weights of a block Muon orthogonalises, read off the model's shape (hpcpar/shape.py's ModelShape):
the planner's and the memory formula's count, held by tests/test_muon.py to the arrays the engine flags
(nn/stage.py's ``mark_matrices``).  Muon keeps one momentum array for each, AdamW's two for the rest."""


def block_matrices(shape):
    """One block's weight matrices as Muon orthogonalises them (optim/muon.py): tuples (inputs,
    outputs, how many, the axis tensor parallelism cuts - 0 rows, 1 columns, None whole on every TP
    rank -, routed: an expert's, cut over ep).  Q, K, V and the output projection; the MLP's, or every
    routed expert's and the shared experts' (the MoE layer is not cut over TP); never the router.
    MLA (nn/mla.py): its down-projections whole on every TP rank, the up-projections cut by columns.
    (A mixture of experts' first dense blocks and the MTP modules' are counted as its other blocks.)"""
    h, d, f, glu = shape.hidden, shape.head_dim, shape.ffn, shape.mlp_matrices - 1    # glu: the input side's
    a, rq, r, dr = shape.heads, shape.q_lora_rank, shape.kv_lora_rank, shape.qk_rope_dim

    def mlp(width, n, cut, routed):
        return [(h, width, n * glu, 1 if cut else None, routed), (width, h, n, 0 if cut else None, routed)]
    if r:
        queries = [(h, rq, 1, None, False), (rq, a * d, 1, 1, False)] if rq else [(h, a * d, 1, 1, False)]
        out = queries + [(h, r + dr, 1, None, False), (r, a * (d - dr + shape.v_head_dim), 1, 1, False),
                         (a * shape.v_head_dim, h, 1, 0, False)]
    else:
        out = [(h, shape.attention_width, 1, 1, False), (h, shape.kv_heads * d, 2, 1, False),
               (shape.attention_width, h, 1, 0, False)]
    if not shape.experts:
        return out + mlp(f, 1, True, False)
    return out + mlp(f, shape.experts, False, True) + \
        (mlp(shape.shared_experts * f, 1, False, False) if shape.shared_experts else [])


def matrix_split(shape, tp, ep):
    """(dense, routed) numbers of one block's matrices (``block_matrices``) on a rank: shape.block_split's
    two parts, Muon's share of each."""
    parts = [0, 0]
    for rows, cols, n, cut, routed in block_matrices(shape):
        parts[routed] += rows * cols * n / (ep if routed else tp if cut is not None else 1)
    return tuple(parts)
