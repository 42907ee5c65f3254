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
"""
import numpy as np

from hpcpar.backend import array_module


def rope_tables(positions, head_size, theta, dtype, xp):
    """positions (T,) - or (B, T), each sequence its own - integers -> cos, sin (T, HS) (or (B, T, HS)),
    computed in float64 on the host, then cast."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_size, 2, dtype=np.float64) / head_size)   # (HS/2,)
    angles = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq                   # (T, HS/2)
    angles = np.concatenate([angles, angles], axis=-1)                                       # (T, HS)
    return xp.asarray(np.cos(angles), dtype=dtype), xp.asarray(np.sin(angles), dtype=dtype)


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
