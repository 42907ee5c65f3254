"""Scaling studies: the same training run at several rank counts, and what the numbers say.

``hpcpar scaling`` (hpcpar/cli/scaling.py) reads as three steps, one module each:

* layouts.py - which tp x pp x dp layout, and which global batch, each point of the sweep runs
  (the ``--layouts`` mini-language, strong and weak scaling);
* sweep.py - one ``mpiexec -n N`` (or ``srun -n N``) job of ``hpcpar train`` per point, each stored
  as one JSON result: the command, its exit status and ``--summary-json``'s figures;
* report.py - from the stored results to speedup, efficiency and the share of the step spent
  outside computation, as a CSV, a table and PNG plots (``hpcpar scaling report DIR`` redraws).

Nothing here imports mpi4py: the driver only starts MPI jobs, it never joins one.  docs/scaling.md
explains the study and how to read the plots.
"""
