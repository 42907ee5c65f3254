"""What the MPI exercises' checks share: the student's code at several group sizes inside one job, a
communicator that writes down where each message went and whether each request completed, and one
verdict that every rank reaches together.

One ``mpiexec -n 4`` job grades a ring at 4, 3 and 2 ranks (``groups``: sub-communicators of the world;
the ranks outside a smaller group wait), so a function written for one size - ``range(3)`` where
``p - 1`` belongs - fails.  Every stage ends in ``agree``: the ranks exchange their verdicts and all of
them raise the first one, so no rank moves on to a stage that another has left.
"""
import numpy as np

from hpcpar.course.wrong import Wrong

P2P = ("send", "recv", "isend", "irecv")
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "bcast", "all_to_all", "all_to_allv", "barrier")


class Agreed(Wrong):
    """A verdict every rank of the job reached together (its message already names the rank)."""


def groups(world, sizes):
    """For each size n: (n, this rank's Communicator of a group of n ranks, or None when it sits out).
    Groups of n consecutive ranks; the world's last size mod n ranks sit out."""
    from mpi4py import MPI

    from hpcpar.comm import Communicator
    for n in sizes:
        color = world.rank // n if world.rank < world.size - world.size % n else MPI.UNDEFINED
        sub = world.mpi.Split(color, world.rank)
        yield n, (Communicator(sub, f"p{n}") if sub != MPI.COMM_NULL else None)


def agree(world, said):
    """Every rank's verdict of one stage (None: passed); on every rank, raise the first one."""
    verdicts = world.mpi.allgather(said)          # a few words a rank, once a stage: pickled is fine
    for rank, text in enumerate(verdicts):
        if text:
            raise Agreed(f"rank {rank}: {text}")


def stage(world, fn, *args):
    """Run ``fn(*args)`` (which raises Wrong) on every rank, then ``agree``: the same verdict everywhere."""
    try:
        fn(*args)
        said = None
    except Agreed:
        raise
    except Wrong as err:
        said = str(err)
    agree(world, said)


class Watched:
    """A Communicator as a check sees it: every call goes to the real one (counted in its stats), and
    each point-to-point call is written down - (op, peer, bytes) - with its request."""

    def __init__(self, comm):
        self._comm, self.log, self.requests = comm, [], []

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def _note(self, op, peer, x, request=None):
        self.log.append((op, int(peer), int(np.asarray(x).nbytes)))
        if request is not None:
            self.requests.append(request)
        return request

    def send(self, x, dest, tag=0):
        self._note("send", dest, x)
        return self._comm.send(x, dest, tag)

    def recv_(self, out, source, tag=0):
        self._note("recv", source, out)
        return self._comm.recv_(out, source, tag)

    def isend(self, x, dest, tag=0):
        return self._note("send", dest, x, self._comm.isend(x, dest, tag))

    def irecv_(self, out, source, tag=0):
        return self._note("recv", source, out, self._comm.irecv_(out, source, tag))

    def calls(self, since):
        """{op: calls} made since ``since`` (a copy of stats.calls taken before)."""
        now = self._comm.stats.calls
        return {op: n - since.get(op, 0) for op, n in now.items() if n - since.get(op, 0)}

    def unfinished(self):
        """The requests never waited for (or tested to completion); waits for them, so that the job
        can go on, and returns how many there were."""
        from mpi4py import MPI
        left = [r for r in self.requests if r.mpi_request != MPI.REQUEST_NULL]
        for r in left:
            r.wait()
        return len(left)


def check_ring_messages(watched, what, sends, nbytes):
    """A ring's messages on this rank: ``sends`` sends (a number, or a tuple of the numbers allowed), all to rank + 1, as many receives, all from rank - 1,
    ``nbytes`` bytes sent in all, every request completed."""
    p, r = watched.size, watched.rank
    left = watched.unfinished()
    if left:
        raise Wrong(f"{what}: {left} of this rank's {len(watched.requests)} requests were never completed - wait "
                    "for every request, the sends too (a send's buffer is MPI's until then)")
    out = [(peer, n) for op, peer, n in watched.log if op == "send"]
    into = [peer for op, peer, _ in watched.log if op == "recv"]
    wrong = [peer for peer, _ in out if peer != (r + 1) % p] + [peer for peer in into if peer != (r - 1) % p]
    if wrong:
        kind = "sent to" if wrong[0] in [peer for peer, _ in out if peer != (r + 1) % p] else "received from"
        raise Wrong(f"{what}: rank {r} {kind} rank {wrong[0]}; in a ring a rank sends only to rank + 1 "
                    f"({(r + 1) % p}) and receives only from rank - 1 ({(r - 1) % p})")
    counts = sends if isinstance(sends, tuple) else (sends,)
    if len(out) not in counts or len(into) != len(out):
        raise Wrong(f"{what}: rank {r} made {len(out)} sends and {len(into)} receives; the ring makes "
                    f"{' or '.join(map(str, counts))} of each")
    if sum(n for _, n in out) != nbytes:
        raise Wrong(f"{what}: rank {r} sent {sum(n for _, n in out)} bytes; the ring sends {nbytes}")
