"""The course: exercises whose answers the tools check (``hpcpar course``, docs/course/).

Each exercise is a small Python file the student fills in: a function to implement, or an ``ANSWER``
to predict before measuring it with ``hpcpar schedule``, ``grid`` or ``train``.  ``hpcpar course check
N`` imports the file and runs reference tests against it; the references are the package's own code.

* exercise.py        the Exercise record, loading a student's file, running a check
* catalog.py         the list of exercises, in lesson order
* check_tp.py        tensor parallelism: column-parallel backward, row-parallel forward, bytes of the all-reduces
* check_pp.py        pipelines: the busy units of a schedule, the 1F1B order
* check_dp.py        data parallelism: the ring all-reduce, ZeRO-1's shard
* check_3d.py        the grid: a rank's coordinates, which pipeline hops cross nodes
* check_state.py     checkpoints and traces: resharding, the bubble and the hidden communication of a trace
* collectives.py     alpha-beta costs of the collectives and the ring all-reduce (docs/collectives.md)
* templates/         the blank exercise files
"""
