"""Pure math, one family per file, each ``*_forward`` next to its ``*_backward`` (llm.c style).

Functions take and return arrays of whatever module they were given (numpy or cupy); none of them
owns state.  Shapes in comments: B batch, T sequence, C channels (hidden), V vocabulary, NH heads,
HS head size (C = NH * HS), N = B * T rows.  Layers with weights split their backward in two:
``*_backward_input`` (dx, on the critical path) and ``*_backward_weight`` (dW, deferrable) - the split
that zero-bubble pipeline schedules exploit.

What a forward returns: its output alone - an array - when the backward needs nothing but the inputs
and the output, which the caller holds anyway (``linear_forward``, ``softmax_forward``, ``rope_forward``);
a tuple ``(output, cache)`` when the backward needs more than that (LayerNorm's xhat and rstd, GELU's
tanh, attention's probabilities, cross-entropy's softmax).  The cache is whatever the backward takes
back, and nothing else: the module that calls the op keeps it between its forward and backward.

The ops are becoming kernels.  Where an op is tuned for the cache - blocks of rows that stay in L2
(blocks.py), row sums as BLAS matrix-vector products, fused passes, causal and document blocks that
skip the keys nobody sees - its file keeps the plain twin beside it: the textbook lines on whole
arrays, named ``*_plain`` (``layernorm_forward_plain``, ``swiglu_forward_plain``,
``attention_forward_plain``), or, beside a ``*_fast`` one, the unsuffixed (``gelu_forward``,
``softmax_forward``).  Read the plain one first: the tuned one computes the same numbers in another
order, and tests/test_fast_ops.py holds each pair equal in float64 to 1e-12 (the optimizers' blocked
updates likewise: hpcpar/optim/__init__.py's sgd_plain and adamw_plain).
"""
