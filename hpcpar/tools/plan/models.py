"""The planner's models: a shape (hpcpar/shape.py, the arithmetic the engine counts with too) from a
preset name (a TOML file in ``hpcpar/tools/plan/models/``), from a TOML file of your own, or from a dims
string such as ``l=24,h=2048,a=16,V=50257``.  An engine run's shape comes from the architecture
registry instead (``GPTConfig.shape``, hpcpar/nn/gpt.py).
"""
from dataclasses import fields, replace

from hpcpar.tools.plan import catalog
from hpcpar.runtime import UsageError
from hpcpar.shape import ModelShape

# short names accepted in a dims string -> field
_ALIASES = {"l": "layers", "h": "hidden", "a": "heads", "V": "vocab", "v": "vocab", "kv": "kv_heads",
            "f": "ffn", "ffn": "ffn"}


def presets():
    """Names of the shipped model files."""
    return catalog.names("models")


def from_mapping(data, name):
    known = {f.name for f in fields(ModelShape) if f.init}
    values = {}
    for key, value in data.items():
        field = _ALIASES.get(key, key)
        if field not in known:
            raise UsageError(f"model {name}: unknown field {key!r} (known: {', '.join(sorted(known))})")
        values[field] = value
    values.setdefault("name", name)
    try:
        return ModelShape(**values)
    except TypeError as err:
        raise UsageError(f"model {name}: {err}") from None


def parse_dims(text):
    """``l=24,h=2048,a=16,V=50257[,kv=..,f=..,gated=1,tied=0]`` -> ModelShape."""
    data = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"model dims {text!r}: expected key=value pairs such as l=24,h=2048,a=16,V=50257")
        key = key.strip()
        value = value.strip()
        if key in ("gated", "tied", "biases", "dropout"):
            data[key] = value.lower() in ("1", "true", "yes")
        elif key in ("positions", "norm", "name", "source"):
            data[key] = value
        else:
            try:
                data[key] = int(value)
            except ValueError:
                raise UsageError(f"model dims: {key}={value} is not an integer") from None
    return from_mapping(data, data.pop("name", text))


def load_model(spec):
    """A preset name, a path to a TOML file, or a dims string -> ModelShape."""
    if "=" in spec:
        return parse_dims(spec)
    mapping, name = catalog.read(spec, "models", "model", ", a .toml file, or dims like l=24,h=2048,a=16,V=50257")
    return from_mapping(mapping, name)


def with_vocab_padded(model, multiple):
    """Megatron pads the vocabulary to a multiple of 128*tp so every TP rank holds an equal slice."""
    padded = -(-model.vocab // multiple) * multiple
    return model if padded == model.vocab else replace(model, vocab=padded)
