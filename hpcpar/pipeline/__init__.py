"""Pipeline parallelism: consecutive blocks of layers on consecutive ranks, micro-batches flowing
through them.

Reading order: schedules.py (a schedule is data: one ordered list of F, B and W per rank),
simulate.py (those lists run in simulated time: timeline, bubble, memory, deadlocks), plot.py (the
picture).
"""
