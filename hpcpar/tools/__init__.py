"""The tools built on the engine (layer 5 of docs/architecture.md): nothing in the engine imports them.

    plan/      the planner: a model, a cluster and a global batch -> the layouts ranked (``hpcpar plan``)
    bench/     the benchmark suite (``hpcpar bench``, ``make bench``: BENCHMARKS.md)
    scaling/   strong and weak scaling sweeps of ``hpcpar train`` (``hpcpar scaling``)
    trace/     the reports read from a run's trace (``hpcpar trace``)
    quotes/    the docs' quoted command outputs, rerun and compared (``python -m hpcpar.tools.quotes``,
               ``make docs``)
"""
