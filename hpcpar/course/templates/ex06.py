"""Exercise 6 (docs/course/04-pipeline.md): the 1F1B order of one stage.

Return the order in which stage `stage` of `stages` runs the forward ("F", mb) and backward ("B", mb)
of micro-batches 0 .. microbatches - 1 under 1F1B (PipeDream-Flush): a few forwards to fill the
pipeline, then one forward and one backward in turn, then the remaining backwards.  How many warm-up
forwards does stage s need so that the last stage never waits?

The check compares your lists with the engine's on five shapes, then trains the tiny GPT at pp 2 and
pp 4 with your order as the trainer's 1F1B (float64: every loss must be one rank's).  Try it yourself:

    .venv/bin/mpiexec -n 2 .venv/bin/hpcpar train --pp 2 --microbatches 4 --plug course-work/ex06.py

Check: .venv/bin/hpcpar course check 6           (it starts mpiexec -n 4)
"""


def one_f_one_b(stage, stages, microbatches):
    """A list of ("F", mb) and ("B", mb) pairs."""
    raise NotImplementedError
