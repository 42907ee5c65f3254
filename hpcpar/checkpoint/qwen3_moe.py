"""Qwen3-MoE weights as Hugging Face writes them (Qwen3MoeForCausalLM): a Llama with QK-norm
(ops/qk_norm.py) whose MLPs are mixtures of experts, kept in the file as Mixtral keeps them
(checkpoint/mixtral.py) under other names.

    model.layers.N.self_attn.{q,k}_norm.weight              (HS,)    QK-norm's gains: ours as they are
    model.layers.N.mlp.gate.weight                          (E, C)   the router (ours: (C, E))
    model.layers.N.mlp.experts.J.{gate,up,down}_proj.weight (F, C), (F, C), (C, F)   expert J
    config.json   num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob, ...

The router takes the softmax over the experts and keeps the top k, renormalised or not
(``norm_topk_prob``, our ``norm_topk``); there are no shared experts.  Sliding-window attention
(``use_sliding_window``, ``sliding_window``) is read as --window over every layer (ops/masks.py's rule).
Options hpcpar does not compute are refused, named: dense layers among the MoE ones (``mlp_only_layers``,
``decoder_sparse_step`` other than 1), attention dropout, besides a Llama's (attention biases, ...).
"""
from hpcpar.checkpoint import llama, mixtral

NAMES = mixtral.ExpertNames("mlp", "gate_proj", "up_proj", "down_proj")
# config.json entries hpcpar does not compute otherwise (beyond a Llama's): (key, the values it accepts)
_SUPPORTED = llama.SUPPORTED + (("mlp_only_layers", ([],)),
                                ("decoder_sparse_step", (1,)), ("attention_dropout", (0, 0.0)))
expected_shapes = mixtral.expected_shapes       # the same parameters, and QK-norm's gains (a Llama's option)


def holds_qwen3_moe(path, what="--init-from"):
    """Does ``path`` (a file or a save_pretrained directory) hold a Qwen3-MoE?"""
    return mixtral.holds(path, what, "qwen3_moe", NAMES)


def read_architecture(path, what="--init-from"):
    """The Architecture of the Qwen3-MoE at ``path``: a Mixtral's, with QK-norm and norm_topk_prob."""
    return mixtral.experts_architecture(path, what, _SUPPORTED, NAMES, "a Qwen3-MoE",
                                        lambda hf: {"qk_norm": True, "norm_topk": _true(hf.get("norm_topk_prob")),
                                                    **llama.sliding_window(hf, _true(hf.get("use_sliding_window")))})


def _true(value):
    """A config.json's boolean, or a lone file's metadata string of one."""
    return str(value) == "True"


def hf_config(mcfg):
    """The config.json of Hugging Face's Qwen3MoeForCausalLM for our Llama with QK-norm and experts (every
    layer a mixture of experts: intermediate_size, the width of dense layers, is never used)."""
    hf = llama.hf_config(mcfg)
    for key in ("mlp_bias", "pretraining_tp"):
        hf.pop(key, None)
    hf.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": mcfg.n_expert,
               "num_experts_per_tok": mcfg.top_k, "moe_intermediate_size": mcfg.d_ff, "norm_topk_prob": mcfg.norm_topk,
               "decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": bool(mcfg.window),
               "sliding_window": llama.window_config(mcfg, "Qwen3-MoE"),
               "attention_dropout": 0.0, "router_aux_loss_coef": mcfg.aux_loss_coef, "output_router_logits": False})
    return hf


def file_metadata(mcfg):
    """What a lone file records beyond its tensors' shapes."""
    return {**llama.file_metadata(mcfg), "model_type": "qwen3_moe", "num_experts_per_tok": mcfg.top_k,
            "norm_topk_prob": mcfg.norm_topk, "use_sliding_window": bool(mcfg.window),
            "sliding_window": llama.window_config(mcfg, "Qwen3-MoE")}
