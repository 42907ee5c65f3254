"""Exercise 39 (docs/course/10-llama.md): what a token costs the KV cache, latent attention against grouped-query.

Generating text, a model keeps for every token it has read what its attention needs of it later (the KV
cache), in every layer.  `model` describes the attention of one model, a dict of

    layers        transformer blocks
    heads         query heads (NH)
    kv_heads      key/value heads of grouped-query attention (NKV; = heads without it)
    head_dim      the width of a query head and of a key head (HS; MLA: dn + dr, the rotary dr included)
    v_head_dim    the width of a value head (= head_dim unless the model says otherwise)
    kv_lora_rank  MLA: the width r of the latent the keys and values are made from (0: not MLA)
    qk_rope_dim   MLA: the width dr of the rotary key, one a token, shared by every head (0: not MLA)

and `itemsize` the bytes of one number (2 for bf16).  Return, in bytes a token over all layers,

    (what the model's KV cache holds - as `hpcpar generate` keeps it,
     what a cache of every head's own key and value would hold)

Check: .venv/bin/hpcpar course check 39
"""


def kv_cache_bytes(model, itemsize):
    """-> (the model's cache, every head's own keys and values), bytes a token"""
    raise NotImplementedError
