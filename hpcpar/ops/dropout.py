"""Inverted dropout: keep each element with probability 1 - p and scale it by 1/(1 - p).

    y = x * D,   D = keep / (1 - p)  (so E[y] = x and evaluation needs no rescaling)
    dx = dy * D

The mask is drawn from a counter-based key, not a global random state: the same key gives the same
mask on any rank, in any order, and again when activations are recomputed.  ``hpcpar.nn.dropout``
builds keys from (seed, step, site, global sample index) so every parallel layout drops the same units.
"""
import numpy as np


def dropout_mask(key, shape, p, dtype):
    """Host (numpy) mask of values 0 or 1/(1-p), drawn from ``key`` (a tuple of non-negative ints)."""
    keep = np.random.default_rng(key).random(shape) >= p
    return keep.astype(dtype) / (1.0 - p)


def dropout_forward(x, mask):
    return x * mask


def dropout_backward(dy, mask):
    return dy * mask
