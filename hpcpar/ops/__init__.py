"""Pure math, one family per file, each ``*_forward`` next to its ``*_backward`` (llm.c style).

Functions take and return arrays of whatever module they were given (numpy or cupy); none of them
owns state.  Shapes in comments: B batch, T sequence, C channels (hidden), V vocabulary, NH heads,
HS head size (C = NH * HS), N = B * T rows.  Layers with weights split their backward in two:
``*_backward_input`` (dx, on the critical path) and ``*_backward_weight`` (dW, deferrable) - the split
that zero-bubble pipeline schedules exploit.
"""
