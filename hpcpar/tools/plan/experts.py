"""A mixture of experts in the planner: what expert parallelism puts on a rank, and what its tokens cost.

hpcpar's MoE layer (docs/moe.md) routes the tokens a rank holds - with sequence parallelism 1/tp of
them (the planner asks for sequence parallelism with tp > 1, as Megatron-core does) - each to top_k
of E experts.  With expert parallelism ep consecutive ranks of dp * cp share every layer's experts,
E/ep each, whole over TP; the router and the shared experts stay whole on every rank.  Per MoE layer
and micro-batch of T routed tokens on a rank (R = T * top_k rows, h hidden, f an expert's width,
S shared experts, e bytes an element):

    parameters     a block's routed experts (shape.routed_params) / ep, whole over TP; the router,
                   shared experts and bias (shape.moe_whole_params) whole; the rest of the block / tp
    model state    zero_memory.with_experts: the dense numbers over the dp * cp ranks, the routed
                   experts over their expert-data group of (dp * cp) / ep ranks (data_parallel's one
                   table; under ZeRO-3 a block's unit gathers its E/ep experts, shape.gathered_block_params)
    activations    the dispatched rows (R h) and the experts' outputs (R h, the combine's backward
                   needs them), each row's MLP tensors (R * 3f gated, 2f plain), the shared experts'
                   (T * 3 S f or 2 S f), the router's scores and weights (T (E + top_k)); hpcpar's GELU
                   cache per row as for a dense MLP
    buffers        with ep > 1 the dispatch's and the combine's receive buffers, R h each
    workspace      one backward of the rows' MLP: R (2 * 2f + h) gated, R (2f + h) plain
    element-wise   the rows' activation, the permutation (gather) and the weighted combine (4 R h),
                   the router's softmax (2 T E)
    all-to-all     dispatch and combine forward, the same two backward: R h e bytes per rank each,
                   (ep - 1) / ep of them leaving the rank (network.ep_all_to_all_seconds); hpcpar's
                   engine waits for each, so none of it is hidden
    gradients      the experts' summed over the expert-data group, the dense ones over dp * cp

On average every expert gets its share: the rows a rank's experts process are R, whatever ep (a
balanced load; a dropless run with an unbalanced router is slower, a capacity factor below 1 faster).
"""
from hpcpar.data_parallel.zero_memory import with_experts
from hpcpar.optim.matrices import matrix_split
from hpcpar.tools.plan.network import across_seconds, ep_all_to_all_seconds, expert_data_seconds


def routed_tokens(layout, tokens):
    """Tokens a rank routes of the ``tokens`` (s * b / cp) it holds: 1/tp of them with sequence parallelism."""
    return tokens / (layout.tp if layout.sp else 1)


def split_params(model, params, layers, layout):
    """(dense, routed experts) numbers on one rank of a stage of ``layers`` blocks holding ``params`` as
    the model shape cuts them (every block / tp): the routed experts / ep instead, the router and shared
    experts whole (shape.block_split, as the engine's zero_memory.rank_params counts)."""
    if not model.experts:
        return params, 0.0
    dense, routed = model.block_split(layout.tp, layout.ep)
    return params - layers * (model.layer_params() / layout.tp - dense), layers * routed


def state_terms(model, layout, params, layers, unit, **numbers):
    """zero_memory.with_experts of one rank: the dense numbers over dp * cp (the routing biases whole
    under ZeRO-3), the routed experts over their expert-data group (dp * cp) / ep."""
    dense, routed = split_params(model, params, layers, layout)
    matrices = tuple(layers * m for m in matrix_split(model, layout.tp, layout.ep))     # Muon's share
    return with_experts(layout.zero, layout.shard, layout.ep, dense, routed, unit,
                        layers * model.routing_bias_params(), matrices, **numbers)


def activation_bytes(model, layout, tokens, elem, numpy_caches):
    """Bytes one MoE layer keeps per micro-batch (module docstring) for the ``tokens`` a rank holds."""
    T = routed_tokens(layout, tokens)
    rows = T * model.top_k
    mlp = 3 if model.gated else 2
    kept = rows * (2 * model.hidden + mlp * model.ffn) + T * mlp * model.shared_experts * model.ffn \
        + T * (model.experts + model.top_k)
    if numpy_caches:                  # hpcpar also keeps GELU's tanh or SwiGLU's sigmoid per row (ops/)
        kept += (rows + T * model.shared_experts) * model.ffn
    return kept * elem


def buffer_bytes(model, layout, tokens, elem):
    """The dispatch's and the combine's receive buffers (with ep > 1)."""
    if layout.ep == 1:
        return 0.0
    return 2 * routed_tokens(layout, tokens) * model.top_k * model.hidden * elem


def workspace_bytes(model, layout, tokens, elem):
    """The transient arrays of the rows' MLP backward: the gradients of its hidden layer and input."""
    rows = routed_tokens(layout, tokens) * model.top_k
    return rows * elem * (2 * (2 if model.gated else 1) * model.ffn + model.hidden)


def elementwise_bytes(model, layout, tokens, elem):
    """HBM bytes of the MoE layer's element-wise forward passes: {name: bytes}."""
    T = routed_tokens(layout, tokens)
    rows = T * model.top_k
    mlp = 3 if model.gated else 2
    return {"activation": (rows + T * model.shared_experts) * model.ffn * mlp * elem,
            "permute, combine, router": (4 * rows * model.hidden + 2 * T * model.experts) * elem}


def dispatch_bytes(model, layout, tokens, elem):
    """Bytes a rank hands one all-to-all: its R = T * top_k rows of h (its own rows included)."""
    return routed_tokens(layout, tokens) * model.top_k * model.hidden * elem


def all_to_all_times(job, layout, tokens):
    """Exposed expert-parallel all-to-alls of one layer and micro-batch: dispatch + combine forward,
    and backward their gradients the same two ways ({} without ep)."""
    if layout.ep == 1:
        return {}
    one = ep_all_to_all_seconds(job, layout, dispatch_bytes(job.model, layout, tokens, job.elem_bytes))
    return {"fwd EP all-to-all": 2 * one, "bwd EP all-to-all": 2 * one}


def gradient_seconds(job, layout, routed, grad_bytes):
    """(reduce-scatter, all-gather) of the ``routed`` expert numbers' gradients over the ranks their
    state is sharded over (0 where each expert lives on one rank of them), the reduce-scatter followed
    by HSDP's all-reduce across (and by all of the sum where an expert's shard group is one rank)."""
    half = expert_data_seconds(job, layout, routed * grad_bytes)
    return half + gradient_across_seconds(job, layout, routed, grad_bytes), half


def gradient_across_seconds(job, layout, routed, grad_bytes):
    """HSDP's all-reduce of the ``routed`` expert numbers' owned gradients across their shard groups."""
    return across_seconds(job, layout, routed * grad_bytes, ("expert-data", "expert-across"))
