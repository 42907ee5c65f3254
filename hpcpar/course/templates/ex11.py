"""Exercise 11 (docs/course/08-tracing.md): the bubble of a traced step.

A trace gives, for each rank of one pipeline, the (start, end) intervals of its forward and backward
actions in one step.  The bubble is the share of the pipeline's device time that is idle:
1 - (busy time of all ranks) / (p x makespan), the makespan running from the first start to the last
end of any rank.

Check: .venv/bin/hpcpar course check 11
"""


def bubble(spans):
    """spans: a list per rank of (start, end) pairs. Returns a float in [0, 1]."""
    raise NotImplementedError
