"""Rotary position embedding (RoPE, Su et al. 2021), in the rotate-half layout of Hugging Face's Llama.

Each head's HS features are HS/2 pairs (x_i, x_{i+HS/2}); the pair of the token at position p is
rotated by the angle p w_i, with w_i = theta^(-2i/HS) (fast turns in the first pairs, slow in the last):

    y = x cos + rotate_half(x) sin,     rotate_half([x1 | x2]) = [-x2 | x1]
    cos, sin (T, HS): cos(p w_i), sin(p w_i) for each token's position p, the HS/2 angles twice

After the rotation q_s . k_t depends on the positions only through s - t: attention sees relative
positions, and no table of positions is learned.  ``positions`` are the global positions of the
tokens this rank holds - any integers, not necessarily 0..T-1 or contiguous (a rank holding a slice
of a long sequence passes the slice's positions).

Backward: rotate_half is the linear map R with R^T = -R (it turns each pair by +90 degrees), and cos,
sin are constants, so

    dx = dy cos + R^T (dy sin) = dy cos - rotate_half(dy sin)

Two variants DeepSeek-V3 uses (its attention: nn/mla.py).  Its checkpoints keep a head's rotary features
*interleaved*, the pair i being (x_2i, x_2i+1) rather than (x_i, x_i+HS/2): ``deinterleave`` puts the
evens first and the odds after, and the rotation is then the one above (transformers'
``apply_rotary_pos_emb_interleave`` gives exactly that layout); its backward is the inverse permutation,
``interleave``.  And its context is stretched by YaRN (ops/yarn.py): other frequencies, and cos, sin
multiplied by an attention factor - ``rope_tables`` takes them from a ``Yarn``.
"""
import numpy as np

from hpcpar.backend import array_module


def rope_tables(positions, head_size, theta, dtype, xp, yarn=None):
    """positions (T,) - or (B, T), each sequence its own - integers -> cos, sin (T, HS) (or (B, T, HS)),
    computed in float64 on the host, then cast.  ``yarn``: a ops/yarn.Yarn stretching the frequencies and
    scaling cos, sin (None: plain RoPE)."""
    if yarn is None:
        inv_freq, scale = 1.0 / theta ** (np.arange(0, head_size, 2, dtype=np.float64) / head_size), 1.0
    else:
        inv_freq, scale = yarn.inv_freq(head_size, theta), yarn.cos_sin_scale()                  # (HS/2,)
    angles = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq                   # (T, HS/2)
    angles = np.concatenate([angles, angles], axis=-1)                                       # (T, HS)
    return xp.asarray(scale * np.cos(angles), dtype=dtype), xp.asarray(scale * np.sin(angles), dtype=dtype)


def rotate_half(x):
    """[x1 | x2] -> [-x2 | x1] along the last axis (..., HS)"""
    half = x.shape[-1] // 2
    return array_module(x).concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope_forward(x, cos, sin):
    """x (B, NH, T, HS), cos, sin (T, HS) -> y (B, NH, T, HS)"""
    return x * cos + rotate_half(x) * sin


def rope_backward(dy, cos, sin):
    """dy (B, NH, T, HS) -> dx (B, NH, T, HS)"""
    return dy * cos - rotate_half(dy * sin)


def deinterleave(x):
    """(..., HS) with pairs (x_2i, x_2i+1) -> (..., HS) [evens | odds]: the rotate-half layout."""
    return array_module(x).concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


def interleave(y):
    """The inverse of ``deinterleave`` (and its adjoint: a permutation's backward is its inverse)."""
    out = array_module(y).empty_like(y)
    half = y.shape[-1] // 2
    out[..., 0::2], out[..., 1::2] = y[..., :half], y[..., half:]
    return out
