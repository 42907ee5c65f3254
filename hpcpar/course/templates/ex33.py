"""Exercise 33 (docs/course/08-tracing.md): two layouts of one job, measured, the faster explained.

The tiny GPT in float32 on 2 ranks, two ways:

    .venv/bin/mpiexec -n 2 .venv/bin/hpcpar train --model tiny --dtype float32 --steps 8 --no-progress \
        --profile --summary-json pp2.json --pp 2 --microbatches 2
    .venv/bin/mpiexec -n 2 .venv/bin/hpcpar train --model tiny --dtype float32 --steps 8 --no-progress \
        --profile --summary-json dp2.json --dp 2

Before you run them, predict which is faster, and by about how much: what does each rank compute, and
what does the pipeline's schedule cost?  `.venv/bin/hpcpar schedule --stages 2 --microbatches 2` is the
simulator the planner uses for every pipeline: it puts a number on the schedule.  Then run them and
fill in ANSWER from the summaries (and the profiles):

    ms_per_step   {"pp2": ..., "dp2": ...}     each run's median step, in milliseconds
    bubble        {"measured": ..., "simulated": ...}   pp 2's bubble as fractions (0.25, not 25)
    faster        "pp2" or "dp2"
    why           the main cause, one of: "bubble", "communication volume", "smaller GEMMs", "memory"

Machines differ, and yours may be busy: the check runs both layouts itself and holds your numbers to
its own - the ratio of the two steps, the measured bubble - never to fixed times.

Check: .venv/bin/hpcpar course check 33            (it runs both layouts: about half a minute)
"""

ANSWER = None
