"""The planner: memory and time of one training step for any layout, before the job is submitted.

Reading order: models.py and hardware.py (the inputs), layout.py and job.py (what is being planned),
flops.py and memory.py (counting), network.py, compute.py and bubble.py (the three kinds of time),
step.py (one step, every term), search.py (every layout, ranked), explain.py (the teaching view),
calibrate.py, pingpong.py, probe.py, cpu.py and local.py (this machine: measured, fitted, predicted),
measured.py (hpcpar's own peak memory against memory.py), published.py, runs/*.toml and validate.py
(the check against published runs).  The command is ``hpcpar plan``;
the model is explained in docs/planning.md.
"""
