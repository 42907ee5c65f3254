"""Exercise 26 (docs/course/16-all-to-all.md): the Ulysses transpose, sequence cut to head cut.

p ranks of a context-parallel group each hold some of the tokens of every sequence: rank r holds
parts[r], an array (B, H, T/p, HS) - its T/p tokens, all H heads - whose tokens sit at the global
positions positions[r] (T/p increasing integers; the ranks' positions together are 0 .. T-1).
Ulysses' all-to-all gives rank j instead every token of heads j H/p .. (j+1) H/p - 1.  Simulate the
whole group: return the list over ranks j of arrays (B, H/p, T, HS), tokens in sequence order.

Check: .venv/bin/hpcpar course check 26
"""


def seq_to_heads(parts, positions):
    """parts: list of p arrays (B, H, T/p, HS); positions: list of p integer arrays -> list of p arrays (B, H/p, T, HS)"""
    raise NotImplementedError
