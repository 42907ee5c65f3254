"""A layout for the ranks that are left when some die: the planner's rule, for a job that goes on.

The rule is jobs/resilient.sbatch's (`hpcpar plan --model ... --gpus N --gpus-per-node P --global-batch
B --zero 0 --recompute none --top 1`, its tp, pp and dp): the planner ranks every layout of N ranks whose
shapes divide and that fits in memory, with ZeRO and recomputation pinned off (the state is rebuilt from
whole replicas or a checkpoint, and the step's memory stays the job's), and the job takes the grid of
the fastest; micro-batches, the schedule's chunks and sequence parallelism are left to hpcpar train's
own defaults.  ``choose`` adds what a running job needs: the grid must also pass hpcpar train's own
checks for this model (``accept``), and when no layout of all N survivors does, it tries N - 1, N - 2, ...
(the ranks left over wait, idle, for the job to end).
"""
from hpcpar.tools.plan.hardware import load_hardware
from hpcpar.tools.plan.job import Job
from hpcpar.tools.plan.search import Space, best_per_grid, search

RULE = Space(fixed=(("zero", 0), ("recompute", "none")))     # resilient.sbatch's --zero 0 --recompute none
HARDWARE = "a100"                                            # hpcpar plan's default, as the script runs it


def grids(shape, ranks, per_node, global_batch, seq_len, hardware=HARDWARE):
    """The (tp, pp, dp) grids of ``ranks`` ranks, ``per_node`` to a node, the fastest layout's first."""
    hw = load_hardware(hardware)
    job = Job(shape, hw, ranks, min(per_node, ranks), global_batch, seq_len,
              dtype="bf16" if "bf16" in hw.peak_flops else "fp32")
    return [(lay.tp, lay.pp, lay.dp) for lay in (e.layout for e in best_per_grid(search(job, RULE)))]


def choose(shape, survivors, per_node, global_batch, seq_len, accept):
    """(ranks, (tp, pp, dp)) for ``survivors`` ranks: the most ranks with a grid the planner ranks and
    ``accept(tp, pp, dp)`` allows (the first such grid of the planner's order); None when none has one.
    ``shape``: the model's (hpcpar/shape.py), or None for a model the planner does not know (the MLP):
    then data parallelism alone."""
    for n in range(survivors, 0, -1):
        options = grids(shape, n, per_node, global_batch, seq_len) if shape is not None else [(1, 1, n)]
        for grid in options:
            if accept(*grid):
                return n, grid
    return None
