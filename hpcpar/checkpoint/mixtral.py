"""Mixtral weights as Hugging Face writes them (MixtralForCausalLM): a Llama whose MLPs are mixtures of
experts (nn/moe.py).

    model.layers.N.block_sparse_moe.gate.weight             (E, C)   the router
    model.layers.N.block_sparse_moe.experts.J.w1.weight     (F, C)   expert J's gate projection
    model.layers.N.block_sparse_moe.experts.J.w3.weight     (F, C)   its up projection
    model.layers.N.block_sparse_moe.experts.J.w2.weight     (C, F)   its down projection
    config.json   num_local_experts, num_experts_per_tok, sliding_window, router_jitter_noise, ...

transformers 5 computes with each layer's experts stacked and writes them one by one, as above.  Ours
are stacked too, in our (in, out) layout:

    layers.N.mlp.gate.weight (C, E)                 = gate^T
    layers.N.mlp.experts.gate_up_proj (E, C, 2F)    = [w1_J^T | w3_J^T] for each J
    layers.N.mlp.experts.down_proj (E, F, C)        = w2_J^T

``stacked`` and ``unstacked`` go between the two; everything else is a Llama's (checkpoint/llama.py).
Other families keep their experts one by one under other names (``ExpertNames``; Qwen3-MoE's,
checkpoint/qwen3_moe.py) and share the rest of this module.
Mixtral routes by softmax over its experts, keeps the top k and renormalises them: hpcpar's defaults.
Sliding-window attention (``sliding_window``) is read as --window over every layer (ops/masks.py's
rule).  Options hpcpar does not compute are refused, named: router jitter noise.
"""
import re

import numpy as np

from hpcpar.checkpoint import llama
from hpcpar.checkpoint.gpt2 import read_config_json, read_header, weights_file
from hpcpar.runtime import UsageError

PREFIX = llama.PREFIX


class ExpertNames:
    """Where a family's file keeps a layer's router and its experts, one by one (names without the
    prefix): the MoE module of a layer, and expert J's gate, up and down projections."""

    def __init__(self, block, gate, up, down):
        self.projections = (gate, up, down)
        self.block = block
        self.router = re.compile(rf"^layers\.(\d+)\.{block}\.gate\.weight$")
        self.expert = re.compile(rf"^layers\.(\d+)\.{block}\.experts\.(\d+)\.({gate}|{up}|{down})\.weight$")

    def held_by(self, names):
        """Are ``names`` (a file's tensor names without the prefix) those of this family's experts?"""
        return any(self.expert.match(n) for n in names)


NAMES = ExpertNames("block_sparse_moe", "w1", "w3", "w2")
# config.json entries hpcpar does not compute otherwise (beyond a Llama's): (key, the values it accepts)
_SUPPORTED = llama.SUPPORTED + (("router_jitter_noise", (0, 0.0)),)


def holds_mixtral(path, what="--init-from"):
    """Does ``path`` (a file or a save_pretrained directory) hold a Mixtral?"""
    return holds(path, what, "mixtral", NAMES)


def holds(path, what, model_type, names):
    """Does ``path`` hold a model of ``model_type`` (its config.json says), or - a lone file - its experts?"""
    hf = read_config_json(path, what)
    if hf:
        return hf.get("model_type") == model_type
    return names.held_by([k.removeprefix(PREFIX) for k in read_header(weights_file(path), what)[0]])


def _ours(i):
    return f"layers.{i}.mlp.gate.weight", f"layers.{i}.mlp.experts.gate_up_proj", f"layers.{i}.mlp.experts.down_proj"


def stacked(tensors, names=NAMES):
    """{file name without the prefix: array (the file's layout, a Llama's already transposed)} -> ours:
    each layer's router transposed, its experts stacked.  Works on shapes too (tuples for arrays).
    ``names``: where the family's file keeps them."""
    out, experts = {}, {}
    for name, t in tensors.items():
        gate, expert = names.router.match(name), names.expert.match(name)
        if gate:
            out[_ours(int(gate[1]))[0]] = _transposed(t)
        elif expert:
            experts.setdefault(int(expert[1]), {})[(int(expert[2]), expert[3])] = t
        else:
            out[name] = t
    for i, parts in experts.items():
        E = 1 + max(j for j, _ in parts)
        w = [[parts.get((j, k)) for j in range(E)] for k in names.projections]       # gate, up, down
        if any(t is None for ts in w for t in ts):
            raise UsageError(f"layer {i} of the file lacks some of its {E} experts' "
                             f"{', '.join(names.projections)}")
        out[_ours(i)[1]] = _stack([_concat(_transposed(a), _transposed(b)) for a, b in zip(w[0], w[1])])
        out[_ours(i)[2]] = _stack([_transposed(t) for t in w[2]])
    return out


def unstacked(weights, n_layer, names=NAMES):
    """Our names and layouts -> the file's (the inverse of ``stacked``; Llama's tensors left as they are).
    Layers without experts (DeepSeek-V3's first, dense ones) stay as they are."""
    out = dict(weights)
    gate_name, up_name, down_name = names.projections
    for i in range(n_layer):
        if _ours(i)[0] not in out:
            continue
        gate, gate_up, down = (out.pop(n) for n in _ours(i))
        out[f"layers.{i}.{names.block}.gate.weight"] = gate.T
        F = down.shape[1]
        for j in range(len(gate_up)):
            base = f"layers.{i}.{names.block}.experts.{j}"
            out[f"{base}.{gate_name}.weight"] = gate_up[j][:, :F].T
            out[f"{base}.{up_name}.weight"] = gate_up[j][:, F:].T
            out[f"{base}.{down_name}.weight"] = down[j].T
    return out


def _transposed(t):
    return tuple(reversed(t)) if isinstance(t, tuple) else t.T


def _concat(a, b):
    return (a[0], a[1] + b[1]) if isinstance(a, tuple) else np.concatenate([a, b], axis=1)


def _stack(ts):
    return (len(ts),) + ts[0] if isinstance(ts[0], tuple) else np.stack(ts)


def expected_shapes(mcfg):
    """{parameter name: full shape} of the whole Mixtral of config ``mcfg``, in our layout."""
    C, F, E = mcfg.d_model, mcfg.d_ff, mcfg.n_expert
    shapes = {n: s for n, s in llama.expected_shapes(mcfg).items() if ".mlp." not in n}
    for i in range(mcfg.n_layer):
        gate, gate_up, down = _ours(i)
        shapes.update({gate: (C, E), gate_up: (E, C, 2 * F), down: (E, F, C)})
    return shapes


def read_architecture(path, what="--init-from"):
    """The Architecture of the Mixtral at ``path``: a Llama's, with its experts and top-k."""
    return experts_architecture(path, what, _SUPPORTED, NAMES, "a Mixtral", llama.sliding_window)


def experts_architecture(path, what, supported, names, title, extra=lambda hf: {}):
    """The Architecture of a Llama with experts at ``path``, its file's config checked against
    ``supported``, its experts where ``names`` says; ``extra(config)``: the family's further fields."""
    source, shapes, hf = llama.read_shapes(path, what, supported)
    shapes = stacked(shapes, names)
    n_expert = shapes["layers.0.mlp.gate.weight"][1] if "layers.0.mlp.gate.weight" in shapes else 0
    if not n_expert:
        raise UsageError(f"{what}: {source} is not {title} (no layers.0.{names.block}.gate.weight)")
    top_k = int(hf.get("num_experts_per_tok", 0))
    if not top_k:
        raise UsageError(f"{what}: {source} does not say num_experts_per_tok (put its config.json beside it)")
    return llama.architecture(source, shapes, hf, what, shapes["layers.0.mlp.experts.down_proj"][1],
                              expected_shapes, n_expert=n_expert, top_k=top_k, **extra(hf))


def hf_config(mcfg):
    """The config.json of Hugging Face's MixtralForCausalLM for our Llama with experts."""
    hf = llama.hf_config(mcfg)
    for key in ("attention_bias", "mlp_bias", "pretraining_tp"):
        hf.pop(key, None)
    hf.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": mcfg.n_expert,
               "num_experts_per_tok": mcfg.top_k, "sliding_window": llama.window_config(mcfg, "Mixtral"),
               "router_jitter_noise": 0.0,
               "router_aux_loss_coef": mcfg.aux_loss_coef, "output_router_logits": False})
    return hf


def file_metadata(mcfg):
    """What a lone file records beyond its tensors' shapes."""
    return {**llama.file_metadata(mcfg), "model_type": "mixtral", "num_experts_per_tok": mcfg.top_k,
            "sliding_window": llama.window_config(mcfg, "Mixtral")}
