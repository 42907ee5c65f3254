"""Multi-head latent attention's own math (DeepSeek-V2/V3): the heads assembled from the projections, and the
attention of generation straight from the cached latent.  The projections and norms around them are
ordinary (nn/mla.py).  Legend: B batch, T tokens, nh heads (this rank's), dn a head's query/key features
without rotation, dr its rotary ones, dq = dn + dr, dv a head's value width, r the K/V latent's width.

    q      (B, T, nh*dq)        per head [q_nope (dn) | q_rot (dr)]
    kv     (B, T, nh*(dn+dv))   per head [k_nope (dn) | v (dv)]          the latent's up-projection
    k_rope (B, T, dr)           ONE rotary key per token, shared by every head (the "MQA" part)

    q_h = [q_nope_h | rope(q_rot_h)] c,   k_h = [k_nope_h | rope(k_rope)],   v_h          (B, nh, T, .)

``c`` makes the core's 1/sqrt(width) the model's softmax scale (1/sqrt(dq), times YaRN's mscale^2:
ops/yarn.py).  The core (nn/attention_core.py, or ring / Ulysses attention) takes q, k, v of one width,
so the narrower of (q, k) and v is padded with zeros to W = max(dq, dv): a zero column of v gives a zero
column of o (dropped after), zero columns of q and k add nothing to a score, and c absorbs the sqrt(W).
Backward: the pads' gradients are dropped, the shared rotary key's gradient summed over the heads

    dk_rope = sum_h rope^T(dk_h[..., dn:dq])       (B, T, dr)   - a partial sum on a tensor-parallel rank

Generation caches per token only [c_kv (r) | rope(k_rope) (dr)] - 576 numbers a layer in V3 against
2 * 128 * 192 = 49152 for the keys and values it stands for - and attends without expanding them
(``latent_cached_forward``, the "absorbed" form: W_uk folded into the query, W_uv applied after the
weighted sum):

    score_t = (W_uk_h q_nope_h) . c_t + q_rot_h . k_rope_t          o_h = (sum_t p_t c_t) W_uv_h
"""
import math

from hpcpar.backend import array_module
from hpcpar.ops.attention import split_heads
from hpcpar.ops.rope import deinterleave, interleave, rope_backward, rope_forward
from hpcpar.ops.softmax import softmax_forward


def _rotate(x, cos, sin, interleaved):
    return rope_forward(deinterleave(x) if interleaved else x, cos, sin)


def _rotate_backward(dy, cos, sin, interleaved):
    dx = rope_backward(dy, cos, sin)
    return interleave(dx) if interleaved else dx


def mla_heads_forward(q, kv, k_rope, nh, dims, cos, sin, interleaved, scale):
    """q (B, T, nh*dq), kv (B, T, nh*(dn+dv)), k_rope (B, T, dr); dims = (dn, dr, dv); cos, sin (T, dr), or
    (B, 1, T, dr) when each sequence has its own positions (documents);
    ``scale``: the softmax scale times sqrt(dq) (1 without YaRN) -> qh, kh, vh (B, nh, T, W), cache"""
    dn, dr, dv = dims
    dq, W = dn + dr, max(dn + dr, dv)
    xp = array_module(q)
    qs, kvs = split_heads(q, nh), split_heads(kv, nh)                      # (B, nh, T, dq), (B, nh, T, dn+dv)
    B, _, T, _ = qs.shape
    c = scale * math.sqrt(W / dq)                                          # the core divides by sqrt(W)
    qh = xp.zeros((B, nh, T, W), dtype=q.dtype)
    kh = xp.zeros((B, nh, T, W), dtype=q.dtype)
    vh = xp.zeros((B, nh, T, W), dtype=q.dtype) if dv < W else None
    qh[..., :dn] = qs[..., :dn] * c
    qh[..., dn:dq] = _rotate(qs[..., dn:], cos, sin, interleaved) * c
    kh[..., :dn] = kvs[..., :dn]
    kh[..., dn:dq] = _rotate(k_rope[:, None], cos, sin, interleaved)       # (B, 1, T, dr): every head's
    if vh is None:
        vh = array_module(q).ascontiguousarray(kvs[..., dn:])
    else:
        vh[..., :dv] = kvs[..., dn:]
    return qh, kh, vh, (nh, dims, cos, sin, interleaved, c)


def mla_heads_backward(dqh, dkh, dvh, cache):
    """dqh, dkh, dvh (B, nh, T, W) -> dq (B, T, nh*dq), dkv (B, T, nh*(dn+dv)), dk_rope (B, T, dr)"""
    nh, (dn, dr, dv), cos, sin, interleaved, c = cache
    dq_w = dn + dr
    xp = array_module(dqh)
    B, _, T, _ = dqh.shape
    dq = xp.empty((B, T, nh, dq_w), dtype=dqh.dtype)                       # merged heads, written per head
    dq[..., :dn] = (dqh[..., :dn] * c).transpose(0, 2, 1, 3)
    dq[..., dn:] = (_rotate_backward(dqh[..., dn:dq_w], cos, sin, interleaved) * c).transpose(0, 2, 1, 3)
    dkv = xp.empty((B, T, nh, dn + dv), dtype=dqh.dtype)
    dkv[..., :dn] = dkh[..., :dn].transpose(0, 2, 1, 3)
    dkv[..., dn:] = dvh[..., :dv].transpose(0, 2, 1, 3)
    dk_rope = _rotate_backward(dkh[..., dn:dq_w].sum(axis=1, keepdims=True), cos, sin, interleaved)[:, 0]  # (B, T, dr)
    return dq.reshape(B, T, nh * dq_w), dkv.reshape(B, T, nh * (dn + dv)), dk_rope


def latent_cached_forward(q, latent, k_rope, cache, w_kv, dims, cos, sin, interleaved, scale, start):
    """Forward only, for generation: the new tokens at positions [start, start + T) attend to every cached
    one, through the latent.  q (B, T, NH*dq) their queries; latent (B, T, r) their normalised K/V latent,
    k_rope (B, T, dr) their rotary key (unrotated); ``cache`` = (c_cache (B, T_max, r), r_cache (B, T_max, dr))
    gains both (the key rotated); w_kv (r, NH*(dn+dv)) the up-projection; ``scale`` the softmax scale times
    sqrt(dq).  -> o (B, T, NH*dv)"""
    dn, dr, dv = dims
    xp = array_module(q)
    c_cache, r_cache = cache
    B, T, _ = q.shape
    end, r = start + T, latent.shape[-1]
    NH = w_kv.shape[1] // (dn + dv)
    c_cache[:, start:end] = latent
    r_cache[:, start:end] = _rotate(k_rope, cos, sin, interleaved)
    qs = split_heads(q, NH)                                                # (B, NH, T, dq)
    q_rot = _rotate(qs[..., dn:], cos, sin, interleaved)                   # (B, NH, T, dr)
    w = w_kv.reshape(r, NH, dn + dv).transpose(1, 0, 2)                    # (NH, r, dn+dv)
    q_lat = qs[..., :dn] @ w[:, :, :dn].swapaxes(-1, -2)           # (B, NH, T, r): W_uk folded in
    s = q_lat @ c_cache[:, None, :end].swapaxes(-1, -2) + q_rot @ r_cache[:, None, :end].swapaxes(-1, -2)
    s *= scale / math.sqrt(dn + dr)                                        # (B, NH, T, end)
    s += xp.triu(xp.full((T, end), -xp.inf, dtype=s.dtype), k=start + 1)
    o_lat = softmax_forward(s, out=s) @ c_cache[:, None, :end]             # (B, NH, T, r)
    o = o_lat @ w[:, :, dn:]                                     # (B, NH, T, dv): W_uv after the sum
    return xp.ascontiguousarray(o.transpose(0, 2, 1, 3)).reshape(B, T, NH * dv)
