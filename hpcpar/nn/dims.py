"""More of a model's sizes and options as text (``--dims``): the GPTConfig fields that have no flag of their
own - DeepSeek-V3's latent attention, its first dense layers, its routing and its YaRN - written as
``name=value`` pairs, so that a run, a TOML file and a checkpoint's saved options can carry them, and
``--init-from`` can fill them in from a file (checkpoint/deepseek_v3.py).

    q_lora_rank=1536,kv_lora_rank=512,qk_rope_dim=64,v_head_dim=128,first_dense=3,d_ff_dense=18432,
    n_group=8,topk_group=4,routed_scale=2.5,yarn_factor=40,yarn_original_positions=4096,...

The ``yarn_*`` pairs make one ops/yarn.Yarn (``yarn_factor`` and ``yarn_original_positions`` at least).
"""
from dataclasses import fields

from hpcpar.ops.yarn import Yarn
from hpcpar.runtime import UsageError

FIELDS = {"q_lora_rank": int, "kv_lora_rank": int, "qk_rope_dim": int, "v_head_dim": int, "rope_interleave": bool,
          "first_dense": int, "d_ff_dense": int, "n_group": int, "topk_group": int, "routed_scale": float}
YARN = {f"yarn_{f.name}": f.type for f in fields(Yarn)}


def _value(name, text, kind):
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        return kind(text)
    except ValueError:
        what = {int: "an integer", float: "a number", bool: "true or false"}[kind]
        raise UsageError(f"--dims: {name}={text} must be {what}") from None


def parse_dims(text):
    """``name=value,...`` -> {GPTConfig field: value} (the yarn_* pairs as one ``yarn``)."""
    out, yarn = {}, {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or (name not in FIELDS and name not in YARN):
            raise UsageError(f"--dims: {item!r} is not one of name=value with name in "
                             f"{', '.join(list(FIELDS) + list(YARN))}")
        if name in FIELDS:
            out[name] = _value(name, value.strip(), FIELDS[name])
        else:
            yarn[name.removeprefix("yarn_")] = _value(name, value.strip(), YARN[name])
    if yarn:
        if "factor" not in yarn or "original_positions" not in yarn:
            raise UsageError("--dims: YaRN needs yarn_factor and yarn_original_positions")
        out["yarn"] = Yarn(**yarn)
    return out


def dims_text(values):
    """The inverse of ``parse_dims``: {field: value} -> ``name=value,...``."""
    items = [(k, v) for k, v in values.items() if k != "yarn"]
    yarn = values.get("yarn")
    if yarn is not None:
        items += [(f"yarn_{f.name}", getattr(yarn, f.name)) for f in fields(Yarn)]
    return ",".join(f"{k}={v}" for k, v in items)
