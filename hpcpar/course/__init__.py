"""The course: exercises whose answers the tools check (``hpcpar course``, docs/course/).

Each exercise is a small Python file the student fills in: a function to implement, an ``ANSWER`` to
predict before measuring it, this rank's part of a program that ``hpcpar course check N`` runs on
MPI ranks, or functions that ``hpcpar train --plug`` runs inside the real training step.  The checks
run reference cases against it at more than one size; the references are the package's own code,
hidden from the student's file, and tests/test_course.py feeds every check the wrong answers
students are known to write.  The rules a new exercise follows: docs/course/README.md, "Adding an
exercise: the rules".

* exercise.py        the Exercise record, loading a student's file, the verdict of a check
* catalog.py         the list of exercises, with their hints and the modules that hold their answers
* lessons.py         the lessons: order, minutes, pictures, discussion answers
* guard.py           the reference out of reach: the student's imports, fenced
* wrong.py           what a check raises: Wrong, Crashed
* hints.py           hints one at a time, logged and signed with the teacher's key
* grade.py           grading a class: every exercise of every folder in a process of its own
* key.py             the instructor key: answers as a student would write them, discussion answers
* pictures.py        the lessons' pictures, drawn by the package's functions (make docs)
* mpi_launch.py      an MPI exercise's job: mpiexec with a timeout, and its verdicts
* mpi_rank.py        what every rank of that job runs
* on_ranks.py        what MPI checks share: groups of several sizes, watched messages, one verdict
* plugged.py         the trainer with the student's functions plugged in, against one rank
* own_schedule.py    a pipeline schedule from your own action lists, simulated and drawn
* check_tp.py        tensor parallelism: column backward, row forward, all-reduce bytes, an MLP on
                     MPI ranks, the column/row pair in the trainer
* check_pp.py        pipelines: busy units, the 1F1B order (in the trainer), a deadlocking program
* check_dp.py        data parallelism: the ring all-reduce (simulated, on MPI ranks), ZeRO-1's shard
* check_3d.py        the grid: a rank's coordinates, which pipeline hops cross nodes
* check_state.py     checkpoints and traces: resharding, the bubble and the hidden communication
* check_cp.py        context parallelism: merging partials, the ring's blocks, the ring in the trainer
* check_llama.py     Llama: the RoPE backward, grouped-query heads under TP, QK-norm's input gradient
* check_precision.py mixed precision: the loss-scale rule
* check_fp8.py       FP8: a 1 x 128 tile quantised, an MX block's E8M0 scale, a sharded weight's amax ranks
* check_hangs.py     hangs: culprits and waits from flight records
* check_memory.py    recomputation: what a block keeps and runs again, measured
* check_measure.py   measuring: two layouts of one job, the faster predicted and explained
* check_zero.py      ZeRO-3: gather a unit before its forward, free it after
* check_v.py         V pipelines: ZB-V's order, graded by the hang checker and the simulator
* check_a2a.py       all-to-alls: dispatch and combine, the Ulysses transpose, expert-parallel bytes,
                     the experts' all-to-alls in the trainer
* check_attention.py attention in causal query blocks: only the keys each block of queries sees
* check_documents.py documents in a packed window: positions and kept targets, the blocks the ring skips
* check_deepseek.py  DeepSeek-V3: MLA's KV cache against GQA's, where the MTP modules sit on a pipeline
* check_recovery.py  going on without a rank: the survivors' places and the transfers of the state
* collectives.py     alpha-beta costs of the collectives and the ring all-reduce (docs/collectives.md)
* templates/         the blank exercise files
* solutions/         the instructor key's answers, each passing its check
"""
