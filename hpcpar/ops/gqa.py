"""Grouped-query attention's K/V repeat (Ainslie et al. 2023): NKV key/value heads serve NH query heads,
each K/V head shared by a group of NH / NKV consecutive query heads (multi-query attention is NKV = 1,
plain multi-head attention NKV = NH).  The K/V projections, and the KV cache, shrink by NH / NKV.

    forward   y[:, h] = x[:, h // n_rep]          x (B, NKV, T, HS) -> y (B, NH, T, HS), n_rep = NH / NKV
    backward  dx[:, j] = sum over the group of j: dy[:, j n_rep + r], r = 0 .. n_rep - 1

A copy used n_rep times collects n_rep gradients: the backward of a repeat is a sum.  Repeating
before the core attention keeps that core ordinary multi-head attention over NH full heads.
"""
from hpcpar.backend import array_module


def repeat_kv_forward(x, n_rep):
    """x (B, NKV, T, HS) -> (B, NKV * n_rep, T, HS)"""
    return x if n_rep == 1 else array_module(x).repeat(x, n_rep, axis=1)


def repeat_kv_backward(dy, n_rep):
    """dy (B, NH, T, HS) -> dx (B, NH / n_rep, T, HS)"""
    if n_rep == 1:
        return dy
    B, NH, T, HS = dy.shape
    return dy.reshape(B, NH // n_rep, n_rep, T, HS).sum(axis=2)
