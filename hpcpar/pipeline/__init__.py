"""Pipeline parallelism: consecutive blocks of layers on consecutive ranks, micro-batches flowing
through them.

Reading order: schedules.py (a schedule is data: one ordered list of F, B and W per rank, and where
each chunk sits), simulate.py (those lists run in simulated time: timeline, bubble, memory,
deadlocks), check.py (the hangs a schedule can have, found before launch), csv_format.py (schedules
as files, torch.distributed.pipelining's format), choice.py (the schedule a run executes, built or
read, and checked), plot.py (the picture), partition.py (which blocks each virtual stage holds),
engine.py (the lists run for real, over MPI), bubble.py (the bubble a run measured, and the
simulator's for the costs it measured).

Everything here but engine.py is pure Python without MPI (tests/test_architecture.py checks it).
"""
