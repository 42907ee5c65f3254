"""The course: exercises whose answers the tools check (``hpcpar course``, docs/course/).

Each exercise is a small Python file the student fills in: a function to implement, an ``ANSWER`` to
predict before measuring it, or this rank's part of a program that ``hpcpar course check N`` runs on
2 or 4 MPI ranks.  The checks run reference cases against it; the references are the package's own
code, and tests/test_course.py feeds every check the wrong answers students are known to write.

* exercise.py        the Exercise record, loading a student's file, the verdict of a check, the hints
* catalog.py         the list of exercises, with their hints
* wrong.py           what a check raises: Wrong, Crashed
* mpi_launch.py      an MPI exercise's job: mpiexec with a timeout, and its verdict
* mpi_rank.py        what every rank of that job runs
* own_schedule.py    a pipeline schedule from your own action lists, simulated and drawn
* check_tp.py        tensor parallelism: column backward, row forward, all-reduce bytes, an MLP on MPI ranks
* check_pp.py        pipelines: busy units, the 1F1B order, a deadlocking two-stage program
* check_dp.py        data parallelism: the ring all-reduce (simulated and on MPI ranks), ZeRO-1's shard
* check_3d.py        the grid: a rank's coordinates, which pipeline hops cross nodes
* check_state.py     checkpoints and traces: resharding, the bubble and the hidden communication of a trace
* check_cp.py        context parallelism: merging online-softmax partials, the ring's key/value blocks
* check_llama.py     Llama: the RoPE backward, grouped-query heads under tensor parallelism, QK-norm's input gradient
* check_precision.py mixed precision: the loss-scale rule
* check_hangs.py     hangs: culprits and waits from flight records
* check_memory.py    recomputation: what a block keeps and runs again, measured
* check_zero.py      ZeRO-3: gather a unit before its forward, free it after
* check_v.py         V pipelines: ZB-V's order, graded by the hang checker and the simulator
* check_a2a.py       all-to-alls: the MoE's dispatch and combine, the Ulysses transpose, expert-parallel bytes
* check_attention.py attention in causal query blocks: only the keys each block of queries sees
* collectives.py     alpha-beta costs of the collectives and the ring all-reduce (docs/collectives.md)
* templates/         the blank exercise files
"""
