"""Model shapes: the few numbers that decide a transformer's memory and FLOPs.

A shape comes from a preset name (a TOML file in ``hpcpar/plan/models/``), from a TOML file of your own,
or from a dims string such as ``l=24,h=2048,a=16,V=50257``.  Parameters of a pre-LN GPT block
(Narayanan et al. 2021, appendix; hpcpar's engine, ``hpcpar/nn``)::

    attention  h*(h + 2*kv*d)  QKV  +  h*h  output       (d = h/a head size; kv = a without GQA)
    MLP        2*h*f  (f = 4h for GPT)  or  3*h*f  for a gated MLP (SwiGLU, Llama)
    biases + LayerNorms  13h for a GPT block (4 LayerNorm vectors, 5 bias vectors)

so a GPT block holds 12h^2 + 13h parameters, and the whole model
P = 12*l*h^2 * (1 + 13/(12h) + (V + s)/(12*l*h)) with tied embeddings and learned positions.
"""
from dataclasses import dataclass, fields, replace

from hpcpar.plan import catalog
from hpcpar.runtime import UsageError

# short names accepted in a dims string -> field
_ALIASES = {"l": "layers", "h": "hidden", "a": "heads", "V": "vocab", "v": "vocab", "kv": "kv_heads",
            "f": "ffn", "ffn": "ffn"}


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    kv_heads: int = 0            # 0: as many as heads (no grouped-query attention)
    ffn: int = 0                 # 0: 4 * hidden
    gated: bool = False          # SwiGLU-style MLP: three matrices instead of two
    tied: bool = True            # the LM head reuses the token embedding
    positions: str = "learned"   # "learned" (s*h parameters) or "rotary"/"alibi" (none)
    biases: bool = True          # GPT has biases and LayerNorm shifts; Llama-style models do not
    dropout: bool = False        # dropout stores a 1-byte mask per element it touches
    source: str = ""

    def __post_init__(self):
        for f in ("layers", "hidden", "heads", "vocab"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise UsageError(f"model {self.name}: {f} must be a positive integer")
        if self.hidden % self.heads:
            raise UsageError(f"model {self.name}: hidden {self.hidden} is not divisible by heads {self.heads}")
        object.__setattr__(self, "kv_heads", self.kv_heads or self.heads)
        object.__setattr__(self, "ffn", self.ffn or 4 * self.hidden)
        if self.heads % self.kv_heads:
            raise UsageError(f"model {self.name}: heads {self.heads} not divisible by kv_heads {self.kv_heads}")

    @property
    def head_dim(self):
        return self.hidden // self.heads

    @property
    def qkv_width(self):
        """Output width of the fused QKV projection: h for queries, kv*d each for keys and values."""
        return self.hidden + 2 * self.kv_heads * self.head_dim

    def layer_params(self):
        """Parameters of one transformer block."""
        h, f = self.hidden, self.ffn
        weights = h * self.qkv_width + h * h + (3 if self.gated else 2) * h * f
        if self.biases:   # QKV, output, MLP biases + two LayerNorms with weight and shift
            return weights + self.qkv_width + h + f * (2 if self.gated else 1) + h + 4 * h
        return weights + 2 * h   # two RMSNorm weights

    def embedding_params(self, seq_len):
        return self.vocab * self.hidden + (seq_len * self.hidden if self.positions == "learned" else 0)

    def head_params(self):
        """Final norm, plus the output projection when it is not tied to the embedding."""
        norm = (2 if self.biases else 1) * self.hidden
        return norm + (0 if self.tied else self.vocab * self.hidden)

    def params(self, seq_len):
        return self.layers * self.layer_params() + self.embedding_params(seq_len) + self.head_params()


def presets():
    """Names of the shipped model files."""
    return catalog.names("models")


def from_mapping(data, name):
    known = {f.name for f in fields(ModelShape)}
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
        elif key in ("positions", "name", "source"):
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
