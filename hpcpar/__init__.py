"""hpcpar: a teachable training engine on MPI - tensor, sequence, pipeline, data (ZeRO, HSDP), context
(ring, Ulysses) and expert parallelism on one grid of ranks.

Reading order for students, one idea a step (README.md's table names a file and a function for each):

 1. comm/grid.py          who talks to whom: the grid of ranks, its groups, the folds (experts, HSDP)
 2. comm/                 how they talk: counted buffer-based collectives and messages
 3. ops/, nn/             the math of one rank: each op's forward beside its backward, then the modules
                          (nn/stage.py: the one door through which the parallelism around a model enters)
 4. tensor_parallel/      tensor and sequence parallelism: f and g (regions.py), the column and row splits
 5. pipeline/             schedules as data (schedules.py), simulated, then run by engine.py
 6. data_parallel/        data parallelism: the flat buffer (flat.py), the replicas protocol (protocol.py),
                          buckets and ZeRO 1-2 (replicas.py), ZeRO-3 (fsdp.py), HSDP's shard groups
 7. context_parallel/     context parallelism: ring attention (ring.py, ops/ring_attention.py), Ulysses
 8. expert_parallel/      expert parallelism: the experts' all-to-alls (dispatch.py)
 9. training/step.py     all of it at once: one step on the grid; loop.py runs the steps and watches them

training/text.py and training/generate.py take real text in and sampled text out; tools/ holds the
planner, the benchmarks, the scaling sweeps, the trace reports and the docs' quotes, built on all of it.
"""
from hpcpar import runtime as _runtime

__version__ = "0.1.0"

# Must run before numpy is imported anywhere: the BLAS threads (one per MPI rank, else the free cores:
# launch.choose_threads), and MPICH told to stop
# busy-polling when a rank waits (ranks share cores on laptops and CI machines).
_runtime.set_launch_defaults()
_runtime.keep_freed_memory()
