"""A payload for the Slurm tests that fails the way a real fault does: rank 1 raises while the
other ranks wait in a barrier.  hpcpar's failure policy (runtime.run_guarded) must then end the
whole job with MPI_Abort, and Slurm must report the job as failed - not leave it hanging.
Flags (the job scripts pass --tp/--pp/--dp) are ignored.
"""
import sys

from hpcpar.runtime import run_guarded   # before mpi4py: hpcpar sets its MPI defaults on import

from mpi4py import MPI


def step():
    comm = MPI.COMM_WORLD
    if comm.rank == 1:
        raise RuntimeError(f"injected fault on rank 1 of {comm.size}")
    comm.Barrier()   # without the abort the other ranks would wait here until the time limit


sys.exit(run_guarded(step))
