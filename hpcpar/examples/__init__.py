"""Small runnable programs that show one idea each, with real numbers.  Each module's docstring says how
to run it; tests/test_examples.py runs every one and checks the lines the docs quote.

    one_step               a single-rank training step traced module by module, with shapes (serial)
    tp_split               the worked example of the column split: one matrix multiply split over 2 ranks (mpiexec -n 2)
    pipeline_by_hand       two pipeline stages and their messages, written out by hand (mpiexec -n 2)
    data_parallel_by_hand  two replicas, half a batch each, gradients summed (mpiexec -n 2)

Every program compares what the parallel ranks computed with what one rank computes alone.
"""
