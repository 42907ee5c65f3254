"""hpcpar: a teachable 3D-parallel (tensor x pipeline x data) training engine on MPI.

Reading order for students: comm/grid.py (who talks to whom), comm/ (how they talk), ops/ and nn/ (the
math of one rank), tensor_parallel/, pipeline/, data_parallel/, then training/train.py (all of it at once);
training/text.py and training/generate.py take real text in and sampled text out.
"""
from hpcpar import runtime as _runtime

__version__ = "0.1.0"

# Must run before numpy is imported anywhere: the BLAS threads (one per MPI rank, else the free cores:
# launch.choose_threads), and MPICH told to stop
# busy-polling when a rank waits (ranks share cores on laptops and CI machines).
_runtime.set_launch_defaults()
_runtime.keep_freed_memory()
