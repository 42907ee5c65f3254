"""Exercise 6 (docs/course/04-pipeline.md): the 1F1B order of one stage.

Return the order in which stage `stage` of `stages` runs the forward ("F", mb) and backward ("B", mb)
of micro-batches 0 .. microbatches - 1 under 1F1B (PipeDream-Flush): a few forwards to fill the
pipeline, then one forward and one backward in turn, then the remaining backwards.  How many warm-up
forwards does stage s need so that the last stage never waits?

Check: .venv/bin/hpcpar course check 6
"""


def one_f_one_b(stage, stages, microbatches):
    """A list of ("F", mb) and ("B", mb) pairs."""
    raise NotImplementedError
