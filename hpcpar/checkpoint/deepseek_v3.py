"""DeepSeek-V3 weights as Hugging Face writes them (DeepseekV3ForCausalLM) and as DeepSeek releases them, their
multi-token-prediction modules included (nn/mla.py, nn/mtp.py; Kimi K2's files are the same model).

    model.layers.N.self_attn.{q_a_proj, q_b_proj | q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj}.weight
    model.layers.N.self_attn.{q_a_layernorm, kv_a_layernorm}.weight        the latents' norms
    model.layers.N.mlp.{gate,up,down}_proj.weight                          N < first_k_dense_replace: dense
    model.layers.N.mlp.gate.{weight, e_score_correction_bias}              else: the router and its bias,
    model.layers.N.mlp.experts.J.{gate,up,down}_proj.weight                the experts one by one (as
    model.layers.N.mlp.shared_experts.{gate,up,down}_proj.weight           Qwen3-MoE's), the shared expert
    model.layers.L+k-1.{enorm, hnorm, eh_proj, shared_head.norm}.weight    MTP module k (L = num_hidden_layers),
    model.layers.L+k-1.<a layer's tensors>                                 its block;
    model.layers.L+k-1.{embed_tokens, shared_head.head}.weight             copies of the model's own
    config.json   q_lora_rank, kv_lora_rank, qk_{nope,rope}_head_dim, v_head_dim, n_group, topk_group,
                  routed_scaling_factor, first_k_dense_replace, rope_parameters (YaRN), num_nextn_predict_layers

Every torch Linear weight is transposed to our (in, out) (checkpoint/llama.py ``transposed``).  The MTP
modules' embedding and head copies are checked equal to the model's and dropped on the way in (hpcpar
shares them), written back on the way out.  What hpcpar does not compute is refused, named: another
activation, attention biases or dropout, a tied head, V2's softmax routing (scoring_func, topk_method),
MoE layers every other layer (moe_layer_freq), K/V heads fewer than the heads, RoPE other than plain or YaRN.
Training-only keys transformers ignores too (aux_loss_alpha, seq_aux) are ignored.
"""
import json
import re

import numpy as np

from hpcpar.checkpoint import llama, mixtral
from hpcpar.checkpoint.gpt2 import Architecture, check_tensors, read_config_json, read_header, weights_file
from hpcpar.nn.dims import dims_text
from hpcpar.ops.yarn import Yarn
from hpcpar.runtime import UsageError

NAMES = mixtral.ExpertNames("mlp", "gate_proj", "up_proj", "down_proj")
_COPIES = re.compile(r"^layers\.(\d+)\.(embed_tokens|shared_head\.head)\.weight$")
_LAYER = re.compile(r"^layers\.(\d+)\.")
SUPPORTED = (("hidden_act", ("silu",)), ("attention_bias", (False,)), ("tie_word_embeddings", (False,)),
             ("attention_dropout", (0, 0.0)), ("scoring_func", ("sigmoid",)), ("topk_method", ("noaux_tc",)),
             ("moe_layer_freq", (1,)), ("pretraining_tp", (1,)))
_MAIN = {"embed_tokens": "embed_tokens.weight", "shared_head.head": "lm_head.weight"}


def without_copies(tensors):
    """A file's tensors without the MTP modules' embedding and head copies, each checked to be the model's
    own (hpcpar shares them).  Works on shapes too."""
    out = {k: v for k, v in tensors.items() if not _COPIES.match(k)}
    for name, copy in tensors.items():
        match = _COPIES.match(name)
        if match:
            main = tensors.get(_MAIN[match[2]])
            same = main is not None and (main == copy if isinstance(copy, tuple) else np.array_equal(main, copy))
            if not same:
                raise UsageError(f"{name} is not the model's {_MAIN[match[2]]}: hpcpar's MTP modules share the "
                                 f"model's embedding and head")
    return out


def to_file(weights, mcfg):
    """Our parameters -> the file's tensors: the experts one by one, the MTP modules' copies added."""
    out = mixtral.unstacked(weights, mcfg.n_layer + mcfg.mtp_depth, NAMES)
    for k in range(mcfg.mtp_depth):
        for piece, main in _MAIN.items():
            out[f"layers.{mcfg.n_layer + k}.{piece}.weight"] = weights[main]
    return out


def _config(path, what):
    """config.json beside the weights, or the config a lone file of ours records, checked against SUPPORTED."""
    source = weights_file(path)
    found, meta = read_header(source, what)
    hf = read_config_json(path, what) or json.loads(meta.get("config", "{}"))
    for key, allowed in SUPPORTED:
        if key in hf and hf[key] not in allowed:
            raise UsageError(f"{what}: {key} = {hf[key]!r} in its config is not supported (hpcpar's DeepSeek-V3 "
                             f"has {allowed[0]!r})")
    if hf.get("num_key_value_heads", hf.get("num_attention_heads")) != hf.get("num_attention_heads"):
        raise UsageError(f"{what}: num_key_value_heads = {hf['num_key_value_heads']} in its config is not supported "
                         f"(multi-head latent attention has a key and a value per head)")
    return source, found, hf


def _yarn(hf, what):
    """The file's RoPE: (theta, Yarn or None)."""
    rope = hf.get("rope_parameters") or dict(hf.get("rope_scaling") or {}, rope_theta=hf.get("rope_theta", 10000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "yarn"):
        raise UsageError(f"{what}: rope_type {kind!r} is not supported (hpcpar's DeepSeek-V3 has plain RoPE or YaRN)")
    theta = float(rope.get("rope_theta", 10000.0))
    if kind == "default":
        return theta, None
    original = rope.get("original_max_position_embeddings")
    factor = rope.get("factor") or hf["max_position_embeddings"] / original
    return theta, Yarn(factor=float(factor), original_positions=int(original),
                       beta_fast=float(rope.get("beta_fast") or 32), beta_slow=float(rope.get("beta_slow") or 1),
                       mscale=float(rope.get("mscale") or 0), mscale_all_dim=float(rope.get("mscale_all_dim") or 0),
                       attention_factor=float(rope.get("attention_factor") or 0), truncate=rope.get("truncate", True))


def read_architecture(path, what="--init-from"):
    """The Architecture of the DeepSeek-V3 at ``path`` (its MTP modules counted), its shapes checked."""
    source, found, hf = _config(path, what)
    shapes = mixtral.stacked(without_copies({k.removeprefix(llama.PREFIX): (tuple(reversed(v)) if llama.transposed(k)
                                                                            else v) for k, v in found.items()}), NAMES)
    if not hf.get("num_hidden_layers") or not hf.get("num_attention_heads"):
        raise UsageError(f"{what}: {source} does not say num_hidden_layers and num_attention_heads (put its "
                         f"config.json beside it)")
    L, held = int(hf["num_hidden_layers"]), 1 + max(int(m[1]) for m in map(_LAYER.match, shapes) if m)
    theta, yarn = _yarn(hf, what)
    V, C = shapes["embed_tokens.weight"]
    E = int(hf.get("n_routed_experts") or 0)
    first = min(int(hf.get("first_k_dense_replace") or 0), L) if E else L
    dims = dict(q_lora_rank=int(hf.get("q_lora_rank") or 0), kv_lora_rank=int(hf["kv_lora_rank"]),
                qk_rope_dim=int(hf["qk_rope_head_dim"]), v_head_dim=int(hf["v_head_dim"]),
                rope_interleave=bool(hf.get("rope_interleave", True)), first_dense=first,
                d_ff_dense=int(hf["intermediate_size"]), n_group=int(hf.get("n_group") or 1),
                topk_group=int(hf.get("topk_group") or 1), routed_scale=float(hf.get("routed_scaling_factor", 1.0)),
                **({"yarn": yarn} if yarn else {}))
    arch = Architecture(n_layer=L, d_model=C, d_ff=int(hf["moe_intermediate_size"]) if E else dims["d_ff_dense"],
                        vocab_size=V, n_positions=int(hf.get("max_position_embeddings", 0)), tied=False,
                        n_head=int(hf["num_attention_heads"]), ln_eps=float(hf.get("rms_norm_eps", 0)),
                        arch="deepseek_v3", head_dim=int(hf["qk_nope_head_dim"]) + dims["qk_rope_dim"],
                        rope_theta=theta, n_expert=E, top_k=int(hf.get("num_experts_per_tok") or 0) if E else 0,
                        norm_topk=bool(hf.get("norm_topk_prob", True)), n_shared_expert=int(hf.get("n_shared_experts")
                                                                                           or 0) if E else 0,
                        router_score="sigmoid" if E else "softmax", mtp_depth=held - L, dims=dims_text(dims))
    from hpcpar.nn.gpt import GPTConfig
    check_tensors(source, shapes, expected_shapes(GPTConfig(**model_fields(arch), vocab_size=V, seq_len=1)))
    return arch


def model_fields(arch):
    """The GPTConfig fields of an Architecture of this family (less the vocabulary and sequence length)."""
    from hpcpar.nn.dims import parse_dims
    experts = dict(n_expert=arch.n_expert, top_k=arch.top_k, norm_topk=arch.norm_topk,
                   n_shared_expert=arch.n_shared_expert, router_score=arch.router_score) if arch.n_expert else {}
    return dict(n_layer=arch.n_layer, n_head=arch.n_head, d_model=arch.d_model, d_ff=arch.d_ff, tied=False,
                arch="deepseek_v3", head_dim=arch.head_dim, mtp_depth=arch.mtp_depth, **experts,
                **parse_dims(arch.dims))


def expected_shapes(mcfg):
    """{parameter name: full shape} of the whole DeepSeek-V3 of config ``mcfg`` (its MTP modules too), ours."""
    C, V, NH, F = mcfg.d_model, mcfg.vocab_size, mcfg.n_head, mcfg.d_ff
    dq, dr, dv, rq, r = mcfg.head_size, mcfg.qk_rope_dim, mcfg.v_size, mcfg.q_lora_rank, mcfg.kv_lora_rank
    shapes = {"embed_tokens.weight": (V, C), "norm.weight": (C,), "lm_head.weight": (V, C)}
    for i in range(mcfg.n_layer + mcfg.mtp_depth):
        a = f"layers.{i}.self_attn"
        shapes.update({f"layers.{i}.input_layernorm.weight": (C,), f"layers.{i}.post_attention_layernorm.weight": (C,),
                       f"{a}.kv_a_proj_with_mqa.weight": (C, r + dr), f"{a}.kv_a_layernorm.weight": (r,),
                       f"{a}.kv_b_proj.weight": (r, NH * (dq - dr + dv)), f"{a}.o_proj.weight": (NH * dv, C)})
        shapes.update({f"{a}.q_a_proj.weight": (C, rq), f"{a}.q_a_layernorm.weight": (rq,),
                       f"{a}.q_b_proj.weight": (rq, NH * dq)} if rq else {f"{a}.q_proj.weight": (C, NH * dq)})
        m = f"layers.{i}.mlp"
        if mcfg.moe_layer(i):
            E, S = mcfg.n_expert, mcfg.n_shared_expert * F
            shapes.update({f"{m}.gate.weight": (C, E), f"{m}.gate.e_score_correction_bias": (E,),
                           f"{m}.experts.gate_up_proj": (E, C, 2 * F), f"{m}.experts.down_proj": (E, F, C)})
            if S:
                shapes.update({f"{m}.shared_experts.gate_proj.weight": (C, S), f"{m}.shared_experts.up_proj.weight":
                               (C, S), f"{m}.shared_experts.down_proj.weight": (S, C)})
        else:
            Fd = mcfg.dense_ff
            shapes.update({f"{m}.gate_proj.weight": (C, Fd), f"{m}.up_proj.weight": (C, Fd),
                           f"{m}.down_proj.weight": (Fd, C)})
        if i >= mcfg.n_layer:
            shapes.update({f"layers.{i}.{n}.weight": (C,) for n in ("enorm", "hnorm", "shared_head.norm")})
            shapes[f"layers.{i}.eh_proj.weight"] = (2 * C, C)
    return shapes


def hf_config(mcfg):
    """The config.json of Hugging Face's DeepseekV3ForCausalLM for our model (``num_nextn_predict_layers``: its
    MTP modules, which DeepSeek's and the inference engines' loaders read from layers L ..)."""
    y = mcfg.yarn
    rope = {"rope_type": "default", "rope_theta": mcfg.rope_theta} if y is None else {
        "rope_type": "yarn", "rope_theta": mcfg.rope_theta, "factor": y.factor,
        "original_max_position_embeddings": y.original_positions, "beta_fast": y.beta_fast, "beta_slow": y.beta_slow,
        **{k: v for k, v in (("mscale", y.mscale), ("mscale_all_dim", y.mscale_all_dim),
                             ("attention_factor", y.attention_factor)) if v}, "truncate": y.truncate}
    E = mcfg.n_expert
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_act": "silu",
            "vocab_size": mcfg.vocab_size, "hidden_size": mcfg.d_model, "intermediate_size": mcfg.dense_ff,
            "moe_intermediate_size": mcfg.d_ff, "num_hidden_layers": mcfg.n_layer,
            "num_attention_heads": mcfg.n_head, "num_key_value_heads": mcfg.n_head,
            "n_routed_experts": E, "n_shared_experts": mcfg.n_shared_expert, "num_experts_per_tok": mcfg.top_k,
            "n_group": mcfg.n_group, "topk_group": mcfg.topk_group, "routed_scaling_factor": mcfg.routed_scale,
            "norm_topk_prob": mcfg.norm_topk, "first_k_dense_replace": mcfg.first_dense if E else mcfg.n_layer,
            "q_lora_rank": mcfg.q_lora_rank or None, "kv_lora_rank": mcfg.kv_lora_rank,
            "qk_nope_head_dim": mcfg.head_size - mcfg.qk_rope_dim, "qk_rope_head_dim": mcfg.qk_rope_dim,
            "v_head_dim": mcfg.v_size, "rope_interleave": mcfg.rope_interleave, "rope_parameters": rope,
            "max_position_embeddings": mcfg.n_positions, "rms_norm_eps": mcfg.ln_eps,
            "num_nextn_predict_layers": mcfg.mtp_depth, "attention_bias": False, "attention_dropout": 0.0,
            "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def file_metadata(mcfg):
    """A lone file records its whole config.json (the family has too many sizes for its shapes to tell)."""
    return {"model_type": "deepseek_v3", "config": json.dumps(hf_config(mcfg))}
