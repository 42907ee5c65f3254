"""Exercise 39, a solution: MLA's KV cache against grouped-query attention's, bytes a token."""


def kv_cache_bytes(model, itemsize):
    if model["kv_lora_rank"]:
        per_layer = model["kv_lora_rank"] + model["qk_rope_dim"]           # the latent and the shared rotary key
    else:
        per_layer = 2 * model["kv_heads"] * model["head_dim"]               # a key and a value per K/V head
    heads = model["heads"] * (model["head_dim"] + model["v_head_dim"])      # every head's key and value
    return itemsize * model["layers"] * per_layer, itemsize * model["layers"] * heads
